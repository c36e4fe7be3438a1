# agentrun's Python code-interpreter driver: one per code context, a persistent interpreter
# whose globals survive between executions (like a Jupyter kernel). Reads one JSON request
# per line on stdin ({"code": "...", "nonce": "...", "env": {...}}: `env`, optional, is set in
# os.environ for that execution only and put back after it); writes events as lines on stdout, each
# prefixed by a marker made of that execution's nonce ("\x01agentrun-NONCE:"):
# {"t":"count","n":N}, {"t":"stdout"|"stderr","text":line}, {"t":"result","text":repr}, then
# {"t":"done"} or {"t":"error","ename","evalue","traceback"}. Output written to the fds
# directly (subprocesses) arrives unprefixed and is passed on as is.
# Rich output: each matplotlib figure still open when an execution ends (a chart, shown or
# not) is sent as a MIME bundle ({"image/png": base64, "text/plain": repr}) in
# {"t":"display_part","data":chunk} lines (the bundle's JSON, cut so that no line is long)
# then {"t":"display"}, and closed. matplotlib draws with Agg (MPLBACKEND, unless set).
# A last expression whose value has rich forms (IPython's `_repr_html_`, `_repr_markdown_`,
# `_repr_latex_`, `_repr_json_`, `_repr_svg_`, `_repr_png_`, `_repr_jpeg_`,
# `_repr_mimebundle_`: a pandas DataFrame's HTML table) is sent the same way as a bundle with
# its repr as "text/plain", ended by {"t":"display","main":true}, in place of its "result".
# An interrupt (SIGINT) raises KeyboardInterrupt in the running execution only, from its
# "count" event on (agentrun hands out the execution's id then); between executions it is
# dropped, as a Jupyter kernel's idle interrupt, so no interrupt ever ends the driver.
# agentrun's other requests, for a semantic fork of the context: {"save": DIR, "nonce"} saves
# the globals in DIR (made; it must not exist) and answers {"t":"saved","carried":[names],
# "skipped":[{"name","reason"}],"more":N}; {"load": DIR, "nonce"} loads them (before any
# execution of a fork's copy), removes DIR and answers {"t":"loaded",...} alike;
# {"drop": DIR, "nonce"} removes DIR. Each ends with {"t":"done"} or {"t":"error",...}. These
# come only from agentrun (on stdin): the context's code can do all they do by itself.
#
# The marker is new for every execution and lives only in _driver's frame and the closures
# made for that execution: no global, no environment variable (which /proc/self/environ would
# keep), so code cannot pick it up by name, and one learnt in an execution is worthless in
# the next (agentrun takes only the current execution's). Code of the context runs in this
# process, so it can still dig the current one out of the interpreter (frames, gc,
# /proc/self/mem) and fake events of the execution that runs it: docs/opensandbox.md.
import ast
import base64
import io
import json
import os
import signal
import sys
import traceback


def _driver():
    # UTF-8 whatever the locale, and written through (what `-u` and PYTHONIOENCODING would
    # do, which would keep a context from being forked by the sandbox's Python zygote).
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8")
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(write_through=True)
    real = sys.__stdout__
    requests = sys.stdin
    sys.stdin = io.StringIO()

    class Lines(io.TextIOBase):
        """An execution's sys.stdout or sys.stderr: its lines as events. Once the execution
        has ended (a thread kept it), it writes through to the real stream, as output
        between executions is."""

        def __init__(self, kind, emit, raw):
            self.kind = kind
            self.emit = emit
            self.raw = raw
            self.buf = ""

        def writable(self):
            return True

        def write(self, text):
            if self.emit is None:
                return self.raw.write(text)
            self.buf += text
            while "\n" in self.buf:
                line, self.buf = self.buf.split("\n", 1)
                self.emit(t=self.kind, text=line)
            return len(text)

        def end(self):
            if self.buf:
                self.emit(t=self.kind, text=self.buf)
                self.buf = ""

    def emitter(mark):
        """Writes an event of the execution whose marker is `mark` (its own closure: one made
        for an earlier execution never writes a later one's marker)."""

        def emit(**ev):
            real.write(mark + json.dumps(ev) + "\n")
            real.flush()

        return emit

    running = False

    def interrupt(signum, frame):
        if running:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)

    # Charts are drawn off-screen (no display in a sandbox), unless the user chose a backend;
    # a matplotlib preloaded by the zygote read its backend before this.
    if "MPLBACKEND" not in os.environ:
        os.environ["MPLBACKEND"] = "Agg"
        mpl = sys.modules.get("matplotlib")
        if mpl is not None and "matplotlib.pyplot" not in sys.modules:
            try:
                mpl.use("Agg")
            except Exception:
                pass
        mpl = None

    # Characters of a display bundle's JSON per line (a line of the driver's must stay short;
    # a local, as everything of the driver's: no global of its own in __main__).
    chunk = 16384

    def figures(emit):
        """Sends every open matplotlib figure as a display bundle, and closes them."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in plt.get_fignums():
            fig = plt.figure(num)
            png = io.BytesIO()
            fig.savefig(png, format="png")
            bundle = json.dumps({
                "image/png": base64.b64encode(png.getvalue()).decode("ascii"),
                "text/plain": repr(fig),
            })
            for i in range(0, len(bundle), chunk):
                emit(t="display_part", data=bundle[i:i + chunk])
            emit(t="display")
        plt.close("all")

    def rich(value):
        """The MIME bundle of `value`'s rich forms (IPython's _repr_*_ methods), with its repr
        as text/plain; None when it has none. A method that raises is skipped."""
        def get(name):
            try:
                return getattr(value, name, None)
            except Exception:  # a __getattr__ of the value's that raises
                return None

        bundle = {}
        if isinstance(value, type):
            return None  # a class: its _repr_*_ are unbound functions
        method = get("_repr_mimebundle_")
        if callable(method):
            try:
                got = method()
                got = got[0] if isinstance(got, tuple) else got
                if isinstance(got, dict):
                    bundle.update((k, v) for k, v in got.items() if isinstance(k, str))
            except Exception:
                pass
        for mime, name in (("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"),
                           ("text/latex", "_repr_latex_"), ("application/json", "_repr_json_"),
                           ("image/svg+xml", "_repr_svg_"), ("image/png", "_repr_png_"),
                           ("image/jpeg", "_repr_jpeg_")):
            method = get(name)
            if mime in bundle or not callable(method):
                continue
            try:
                got = method()
            except Exception:
                continue
            got = got[0] if isinstance(got, tuple) else got
            if isinstance(got, bytes):
                got = base64.b64encode(got).decode("ascii")
            if got is not None:
                bundle[mime] = got
        if not bundle:
            return None
        bundle["text/plain"] = repr(value)
        try:
            return json.dumps(bundle)
        except (TypeError, ValueError):
            return None  # a form JSON cannot carry: the repr alone

    env = {"__name__": "__main__", "__builtins__": __builtins__}

    # The semantic fork of a context (docs/opensandbox-compat.md, "What a fork carries"):
    # agentrun asks the parent's driver to save its globals in a directory of its writable
    # layer (`save`), freezes the layer, asks it to remove them (`drop`); each copy's driver
    # loads them before any execution (`load`) and removes them. One global at a time (one
    # that cannot be pickled is named, the rest carried), pickle protocol 5 with its large
    # buffers (numpy arrays, bytearray, memoryview) out of band in a side file that a copy
    # maps copy-on-write (mmap ACCESS_COPY: the copies share its pages until they write);
    # modules by name; functions defined in the context by value (their code marshalled).
    names = 100  # most names reported per list (the event stays a line of agentrun's)
    big = 1 << 16  # a buffer this large goes out of band
    page = 4096  # out-of-band buffers start on a page of their own

    def reason(e):
        return ("%s: %s" % (type(e).__name__, e))[:150]

    def report(kind, carried, skipped, emit):
        emit(t=kind, carried=[n[:100] for n in carried[:names]], skipped=skipped[:names],
             more=max(0, len(carried) - names) + max(0, len(skipped) - names))

    def save_state(path, emit):
        nonlocal running
        import marshal
        import pickle
        import types

        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
        os.mkdir(path, 0o700)
        carried, skipped, index = [], [], []
        bufs = []  # the out-of-band buffers of the global being saved: [offset, bytes]

        class StatePickler(pickle.Pickler):
            def persistent_id(self, obj):
                t = type(obj)
                if t is types.ModuleType:
                    return ("module", obj.__name__)
                if t is types.FunctionType and obj.__globals__ is env:
                    cells = None
                    if obj.__closure__ is not None:
                        cells = tuple(c.cell_contents for c in obj.__closure__)
                    return ("function", marshal.dumps(obj.__code__), obj.__name__,
                            obj.__qualname__, obj.__defaults__, obj.__kwdefaults__,
                            obj.__doc__, obj.__dict__ or None, cells,
                            obj.__annotations__ or None)
                if t is memoryview:
                    return ("memoryview", pickle.PickleBuffer(obj), obj.format, obj.shape)
                if t is bytearray and len(obj) >= big:  # pickle keeps a bytearray in band
                    return ("bytearray", pickle.PickleBuffer(obj))
                return None

        with open(os.path.join(path, "globals.pickle"), "wb") as data, \
                open(os.path.join(path, "buffers.bin"), "wb") as side:
            def out_of_band(buf):
                try:
                    raw = buf.raw()
                except BufferError:  # not contiguous: in the pickle
                    return True
                if raw.nbytes < big:
                    return True
                at = -(-side.tell() // page) * page
                side.seek(at)
                side.write(raw)
                bufs.append([at, raw.nbytes])
                return False

            running = True  # an interrupt (agentrun's, on a save too slow) ends the save
            try:
                for name, value in list(env.items()):
                    if name in ("__builtins__", "__name__"):
                        continue
                    if not isinstance(name, str):
                        skipped.append({"name": repr(name)[:100], "reason": "not a name"})
                        continue
                    if isinstance(value, types.ModuleType):
                        index.append({"name": name, "module": value.__name__})
                        carried.append(name)
                        continue
                    at, side_at = data.tell(), side.tell()
                    bufs.clear()
                    try:
                        StatePickler(data, protocol=5, buffer_callback=out_of_band).dump(value)
                        index.append({"name": name, "at": at, "buffers": list(bufs)})
                        carried.append(name)
                    except Exception as e:  # this global only (an interrupt ends the save)
                        data.seek(at)
                        data.truncate()
                        side.seek(side_at)
                        side.truncate()
                        skipped.append({"name": name[:100], "reason": reason(e)})
            finally:
                running = False
                name = value = None
        with open(os.path.join(path, "index.json"), "w") as f:
            json.dump(index, f)
        report("saved", carried, skipped, emit)

    def load_state(path, emit):
        import importlib
        import marshal
        import mmap
        import pickle
        import types

        carried, skipped = [], []
        try:
            with open(os.path.join(path, "index.json")) as f:
                index = json.load(f)
            view = None
            with open(os.path.join(path, "buffers.bin"), "rb") as side:
                if os.fstat(side.fileno()).st_size > 0:
                    # Private and copy-on-write: a copy's pages are the file's (the page
                    # cache, shared by all copies) until it writes to them.
                    view = memoryview(mmap.mmap(side.fileno(), 0, access=mmap.ACCESS_COPY))

            class StateUnpickler(pickle.Unpickler):
                def persistent_load(self, pid):
                    if pid[0] == "module":
                        return importlib.import_module(pid[1])
                    if pid[0] == "function":
                        _, code, name, qualname, defaults, kwdefaults, doc, attrs, cells, ann = pid
                        closure = None
                        if cells is not None:
                            closure = tuple(types.CellType(c) for c in cells)
                        f = types.FunctionType(marshal.loads(code), env, name, defaults, closure)
                        f.__qualname__ = qualname
                        f.__kwdefaults__ = kwdefaults
                        f.__doc__ = doc
                        if attrs:
                            f.__dict__.update(attrs)
                        if ann:
                            f.__annotations__ = ann
                        return f
                    if pid[0] == "memoryview":
                        _, buf, fmt, shape = pid
                        m = memoryview(buf)
                        return m if (fmt == "B" and len(shape) == 1) else m.cast("B").cast(fmt, shape)
                    if pid[0] == "bytearray":
                        return bytearray(pid[1])  # a bytearray owns its bytes: copied
                    raise pickle.UnpicklingError("unknown persistent id %r" % (pid[0],))

            with open(os.path.join(path, "globals.pickle"), "rb") as data:
                for entry in index:
                    name = entry["name"]
                    try:
                        if "module" in entry:
                            value = importlib.import_module(entry["module"])
                        else:
                            data.seek(entry["at"])
                            buffers = [view[at:at + n] for at, n in entry["buffers"]]
                            value = StateUnpickler(data, buffers=buffers).load()
                        env[name] = value
                        carried.append(name)
                    except Exception as e:
                        skipped.append({"name": name[:100], "reason": reason(e)})
            value = buffers = view = None
        finally:
            drop_state(path)
        report("loaded", carried, skipped, emit)

    def drop_state(path):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(path))  # the fork's directory, once every context's is gone
        except OSError:
            pass

    def control(request, emit):
        """A request of agentrun's that is not an execution: save, load or drop the state
        of a semantic fork (in `path`, a directory agentrun chose)."""
        for kind, act in (("save", save_state), ("load", load_state), ("drop", None)):
            path = request.get(kind)
            if path is None:
                continue
            try:
                if act is None:
                    drop_state(path)
                else:
                    act(path, emit)
                emit(t="done")
            except BaseException as e:
                emit(t="error", ename=type(e).__name__, evalue=str(e)[:150], traceback=[])
            return True
        return False

    count = 0
    for request in requests:
        try:
            request = json.loads(request)
            emit = emitter("\x01agentrun-%s:" % request["nonce"])
            if control(request, emit):
                request = emit = None
                continue
            code = request["code"]
            run_env = request.get("env") or {}
        except Exception as e:  # a bad request from agentrun itself (never: it sends JSON)
            sys.__stderr__.write("agentrun driver: bad request: %s\n" % e)
            continue
        request = None
        count += 1
        out, err = Lines("stdout", emit, sys.__stdout__), Lines("stderr", emit, sys.__stderr__)
        sys.stdout, sys.stderr = out, err
        saved = {k: os.environ.get(k) for k in run_env}
        try:
            os.environ.update(run_env)
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
            figures(emit)
            if value is not None:
                bundle = rich(value)
                if bundle is None:
                    emit(t="result", text=repr(value))
                else:
                    for i in range(0, len(bundle), chunk):
                        emit(t="display_part", data=bundle[i:i + chunk])
                    emit(t="display", main=True)
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
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            saved = run_env = None
            out.emit = err.emit = None
            value = tree = last = out = err = emit = code = frames = tb = bundle = None


_driver()
