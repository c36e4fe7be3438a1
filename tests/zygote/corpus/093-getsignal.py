# about: signal dispositions as Python sees them
# mode: c
import signal
for name in ('SIGINT', 'SIGPIPE', 'SIGTERM', 'SIGCHLD', 'SIGXFSZ', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGALRM', 'SIGTSTP', 'SIGTTIN', 'SIGTTOU', 'SIGWINCH'):
    print(name, signal.getsignal(getattr(signal, name)))
