# about: -e TMPDIR: tempfile's directory is the run's (the zygote may take the run, with tempfile's cache reset, or fall back)
# mode: c
# env: {"TMPDIR": "/var/tmp"}
# zygote: any
import tempfile
print(tempfile.gettempdir(), tempfile.tempdir)
