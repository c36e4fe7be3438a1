"""The TLS server of the credential tests and of `hack/bench egress`, one copy: the tests
include it (tests/src/tls_server.rs, BEARER_SERVER), the bench runs this file.

    E2E_SECRET=S python3 bearer_server.py ADDR PORT CERT KEY [--keep-alive]

GET answers 200 `auth=ok path=P` when the request carries `Authorization: Bearer S`, else
`auth=missing path=P`. It never echoes a header back. One request per connection
(`Connection: close`), or with --keep-alive HTTP/1.1 connections kept open, each response in
one write with no Nagle (a kept-alive client would otherwise wait for the delayed ACK, 40 ms,
between the head and the body).
"""
import http.server, os, ssl, sys

secret = os.environ["E2E_SECRET"]
keep_alive = "--keep-alive" in sys.argv[5:]


class H(http.server.BaseHTTPRequestHandler):
    if keep_alive:
        protocol_version = "HTTP/1.1"
        wbufsize = 65536
        disable_nagle_algorithm = True

    def do_GET(self):
        ok = self.headers.get("Authorization") == "Bearer " + secret
        body = ("auth=%s path=%s\n" % ("ok" if ok else "missing", self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        if not keep_alive:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


addr, port, cert, key = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
srv = http.server.ThreadingHTTPServer((addr, port), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
