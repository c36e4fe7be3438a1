# agentrun's Python code-interpreter driver: one per code context, a persistent interpreter
# whose globals survive between executions (like a Jupyter kernel). Reads one JSON request
# per line on stdin ({"code": "..."}); writes events as lines on stdout, each prefixed by the
# context's marker: {"t":"count","n":N}, {"t":"stdout"|"stderr","text":line},
# {"t":"result","text":repr}, then {"t":"done"} or {"t":"error","ename","evalue","traceback"}.
# Output written to the fds directly (subprocesses) arrives unprefixed and is passed on as is.
# An interrupt (SIGINT) raises KeyboardInterrupt in the running execution only, from its
# "count" event on (agentrun hands out the execution's id then); between executions it is
# dropped, as a Jupyter kernel's idle interrupt, so no interrupt ever ends the driver.
import ast
import io
import json
import os
import signal
import sys
import traceback

MARK = os.environ.pop("AGENTRUN_CODE_MARKER")
# UTF-8 whatever the locale, and written through (what `-u` and PYTHONIOENCODING would do,
# which would keep a context from being forked by the sandbox's Python zygote).
for _stream in (sys.stdin, sys.stdout, sys.stderr):
    _stream.reconfigure(encoding="utf-8")
for _stream in (sys.stdout, sys.stderr):
    _stream.reconfigure(write_through=True)
REAL = sys.__stdout__
REQUESTS = sys.stdin
sys.stdin = io.StringIO()


def emit(**ev):
    REAL.write(MARK + json.dumps(ev) + "\n")
    REAL.flush()


class Lines(io.TextIOBase):
    def __init__(self, kind):
        self.kind = kind
        self.buf = ""

    def writable(self):
        return True

    def write(self, text):
        self.buf += text
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            emit(t=self.kind, text=line)
        return len(text)

    def end(self):
        if self.buf:
            emit(t=self.kind, text=self.buf)
            self.buf = ""


running = False


def interrupt(signum, frame):
    if running:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, interrupt)
env = {"__name__": "__main__", "__builtins__": __builtins__}
count = 0
for request in REQUESTS:
    try:
        code = json.loads(request)["code"]
    except Exception as e:  # a bad request from agentrun itself
        emit(t="error", ename="RequestError", evalue=str(e), traceback=[])
        continue
    count += 1
    out, err = Lines("stdout"), Lines("stderr")
    sys.stdout, sys.stderr = out, err
    try:
        running = True
        emit(t="count", n=count)
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), env)
        value = eval(compile(last, "<cell>", "eval"), env) if last is not None else None
        running = False
        out.end()
        err.end()
        if value is not None:
            emit(t="result", text=repr(value))
        emit(t="done")
    except BaseException as e:  # SystemExit and KeyboardInterrupt (interrupt) included
        running = False
        out.end()
        err.end()
        # The traceback starts at the user's code: this driver's own frame (it runs as
        # `python3 -c`, file "<string>") is left out.
        frames = e.__traceback__
        if frames is not None and frames.tb_frame.f_code.co_filename == "<string>":
            frames = frames.tb_next
        tb = traceback.format_exception(type(e), e, frames)
        emit(t="error", ename=type(e).__name__, evalue=str(e), traceback=tb)
    finally:
        running = False
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
