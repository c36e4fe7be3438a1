// agentrun: routes Node's built-in fetch() for https URLs through the sandbox's egress proxy
// (HTTPS_PROXY), for Node versions that ignore NODE_USE_ENV_PROXY (Node 20, 22 before 22.21,
// 23, 24 before 24.5). Load it with NODE_OPTIONS=--require=/run/agentrun-egress/node-proxy.cjs
// (docs/credentials.md). No npm package: it reuses the undici that Node bundles (its Agent,
// with a connector that opens an HTTP CONNECT tunnel to the proxy and TLS inside it).
// http:// URLs, node:http(s) and other clients are left as they are.
"use strict";
(() => {
  const env = process.env;
  const proxy = env.HTTPS_PROXY || env.https_proxy;
  if (!proxy || typeof globalThis.fetch !== "function") return;
  const [major, minor] = process.versions.node.split(".").map(Number);
  const honoursEnv = major > 24 || (major === 24 && minor >= 5) || (major === 22 && minor >= 21);
  if (honoursEnv && env.NODE_USE_ENV_PROXY === "1") return;
  let p;
  try {
    p = new URL(proxy);
  } catch {
    return;
  }
  if (p.protocol !== "http:") return;
  const http = require("node:http");
  const net = require("node:net");
  const tls = require("node:tls");
  const noProxy = (env.NO_PROXY || env.no_proxy || "")
    .split(",")
    .map((s) => s.trim().toLowerCase().replace(/^\*?\./, ""))
    .filter(Boolean);
  // As curl and Python do with the same variables: everything through the proxy (agentrun
  // sets no NO_PROXY), but what NO_PROXY names.
  const direct = (host) => noProxy.some((n) => n === "*" || host === n || host.endsWith("." + n));

  // undici's connector contract: connect(opts, callback(err, socket)).
  const tunnel = (opts, callback) => {
    let done = false;
    const finish = (err, socket) => {
      if (done) return;
      done = true;
      callback(err, socket);
    };
    const host = opts.hostname.replace(/^\[|\]$/g, "");
    const port = Number(opts.port) || 443;
    const target = (net.isIPv6(host) ? `[${host}]` : host) + ":" + port;
    const req = http.request({
      host: p.hostname,
      port: Number(p.port) || 80,
      method: "CONNECT",
      path: target,
      headers: { host: target },
      agent: false,
    });
    req.once("connect", (res, socket) => {
      if (res.statusCode !== 200) {
        socket.destroy();
        const e = new Error(
          `agentrun egress proxy: CONNECT ${target}: ${res.statusCode} ${res.statusMessage}`,
        );
        e.code = "UND_ERR_CONNECT";
        return finish(e);
      }
      const t = tls.connect({
        socket,
        host,
        servername: net.isIP(host) ? undefined : opts.servername || host,
        ALPNProtocols: ["http/1.1"],
      });
      t.once("secureConnect", () => finish(null, t));
      t.once("error", (e) => finish(e));
    });
    req.once("error", (e) => finish(e));
    req.end();
  };

  const original = globalThis.fetch;
  const symbol = Symbol.for("undici.globalDispatcher.1");
  let installed = false;
  const install = () => {
    installed = true;
    // The bundled undici is loaded on the first call; it sets its global Agent then.
    if (!globalThis[symbol]) original().catch(() => {});
    const fallback = globalThis[symbol];
    if (!fallback || typeof fallback.dispatch !== "function") return;
    const Agent = fallback.constructor;
    const tunnelled = new Agent({ connect: tunnel });
    globalThis[symbol] = {
      dispatch(opts, handler) {
        let url;
        try {
          url = new URL(opts.origin);
        } catch {
          return fallback.dispatch(opts, handler);
        }
        const host = url.hostname.replace(/^\[|\]$/g, "");
        const d = url.protocol === "https:" && !direct(host) ? tunnelled : fallback;
        return d.dispatch(opts, handler);
      },
      close(...a) {
        return Promise.all([tunnelled.close(), fallback.close(...a)]);
      },
      destroy(...a) {
        return Promise.all([tunnelled.destroy(), fallback.destroy(...a)]);
      },
      on() {
        return this;
      },
      once() {
        return this;
      },
      off() {
        return this;
      },
      removeListener() {
        return this;
      },
    };
  };
  globalThis.fetch = function fetch(...args) {
    if (!installed) install();
    return original.apply(this, args);
  };
})();
