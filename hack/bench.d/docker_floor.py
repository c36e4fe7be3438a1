#!/usr/bin/python3
"""A stand-in Docker daemon for `hack/bench docker`'s floor row: docker_floor.py SOCKET

It answers what `docker run --rm IMAGE CMD` asks (ping, create, attach, wait, start) at once
and does nothing else: the docker CLI's time against it is the CLI's own (process start, its
Go runtime, config, the requests and their connections), which no daemon can go below. It
serves until killed.
"""
import json
import os
import socket
import socketserver
import sys

CONTAINER_ID = "f" * 64


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        f = self.request.makefile("rb")
        while True:
            line = f.readline()
            if not line:
                return
            method, path, _ = line.decode().split(" ", 2)
            length = 0
            while True:
                h = f.readline()
                if h in (b"\r\n", b""):
                    break
                k, _, v = h.decode().partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            if length:
                f.read(length)
            path = path.split("?")[0]
            if path.endswith("/_ping"):
                self.reply("200 OK", b"" if method == "HEAD" else b"OK", "text/plain")
            elif path.endswith("/containers/create"):
                self.reply("201 Created", json.dumps({"Id": CONTAINER_ID, "Warnings": []}).encode())
            elif path.endswith("/attach"):
                # Hijacked, and the container printed nothing: the stream ends at once.
                self.request.sendall(
                    b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
                    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
                )
                self.request.shutdown(socket.SHUT_WR)
                return
            elif path.endswith("/wait"):
                self.reply("200 OK", b'{"StatusCode":0}')
            elif path.endswith("/start"):
                self.reply("204 No Content")
            else:
                self.reply("404 Not Found", json.dumps({"message": f"not in the stand-in: {path}"}).encode())

    def reply(self, status, body=b"", ctype="application/json"):
        head = f"HTTP/1.1 {status}\r\nApi-Version: 1.44\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
        self.request.sendall(head.encode() + body)


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


if __name__ == "__main__":
    path = sys.argv[1]
    if os.path.exists(path):
        os.unlink(path)
    Server(path, Handler).serve_forever()
