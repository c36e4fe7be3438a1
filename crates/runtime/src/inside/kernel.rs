//! The kernel calls a cell's PID 1 and a shell's init decide on, behind one small trait
//! ([`Kernel`]), so their decisions are tested without root (as youki's `syscall/syscall.rs`
//! beside `syscall/test.rs`): [`Host`] makes the calls; a test's implementation records them
//! and fails the ones it is told to. Only what a decision depends on is here: the cell's
//! confinement steps (rlimits, capabilities, Landlock, seccomp: which, with what, in which
//! order, and that a failing step stops the rest) and whether a shell's spare cell still
//! runs (reused, or a new one cloned).

use std::os::fd::{BorrowedFd, OwnedFd};

use caps::Capability;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::resource::Resource;
use seccompiler::BpfProgram;

use crate::confine::landlock::{LandlockError, LandlockRules};
use crate::confine::seccomp::SeccompError;

/// The kernel, as the cell and the shell's init use it.
pub(crate) trait Kernel {
    /// setrlimit(2), soft = hard = `value`.
    fn setrlimit(&self, resource: Resource, value: u64) -> nix::Result<()>;
    /// Keeps only `keep` of this process's capabilities (bounding set included).
    fn narrow_capabilities(&self, keep: &[Capability]) -> Result<(), caps::errors::CapsError>;
    /// Restricts this process with Landlock `rules`; with `share`, a copy of the ruleset.
    fn landlock(
        &self,
        rules: &LandlockRules,
        host_abi: u32,
        share: bool,
    ) -> Result<Option<OwnedFd>, LandlockError>;
    /// Installs seccomp `filters` on this process.
    fn seccomp(&self, filters: &[BpfProgram]) -> Result<(), SeccompError>;
    /// Whether the process of `pidfd` has exited (its pidfd is readable).
    fn exited(&self, pidfd: BorrowedFd<'_>) -> bool;
}

/// The real kernel.
pub(crate) struct Host;

impl Kernel for Host {
    fn setrlimit(&self, resource: Resource, value: u64) -> nix::Result<()> {
        nix::sys::resource::setrlimit(resource, value, value)
    }

    fn narrow_capabilities(&self, keep: &[Capability]) -> Result<(), caps::errors::CapsError> {
        crate::inside::reaper::narrow_capabilities(keep)
    }

    fn landlock(
        &self,
        rules: &LandlockRules,
        host_abi: u32,
        share: bool,
    ) -> Result<Option<OwnedFd>, LandlockError> {
        crate::confine::landlock::restrict_sharing(rules, host_abi, share).map(|(_, fd)| fd)
    }

    fn seccomp(&self, filters: &[BpfProgram]) -> Result<(), SeccompError> {
        crate::confine::seccomp::install(filters)
    }

    fn exited(&self, pidfd: BorrowedFd<'_>) -> bool {
        let mut fds = [PollFd::new(pidfd, PollFlags::POLLIN)];
        !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
    }
}

/// A kernel for tests: records every call in order, fails the calls named in `fail`, and
/// says the processes whose pidfd is in `exited` have exited.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Recorder {
    pub calls: std::cell::RefCell<Vec<Call>>,
    pub fail: Vec<&'static str>,
    pub exited: Vec<std::os::fd::RawFd>,
}

/// One recorded kernel call.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    Setrlimit(Resource, u64),
    NarrowCapabilities(Vec<Capability>),
    Landlock {
        readable: Vec<std::path::PathBuf>,
        writable: Vec<std::path::PathBuf>,
        abi: u32,
        share: bool,
    },
    Seccomp(usize),
}

#[cfg(test)]
impl Recorder {
    fn failing(&self, name: &str) -> bool {
        self.fail.contains(&name)
    }
}

#[cfg(test)]
impl Kernel for Recorder {
    fn setrlimit(&self, resource: Resource, value: u64) -> nix::Result<()> {
        self.calls
            .borrow_mut()
            .push(Call::Setrlimit(resource, value));
        if self.failing("setrlimit") {
            return Err(nix::Error::EPERM);
        }
        Ok(())
    }

    fn narrow_capabilities(&self, keep: &[Capability]) -> Result<(), caps::errors::CapsError> {
        self.calls
            .borrow_mut()
            .push(Call::NarrowCapabilities(keep.to_vec()));
        if self.failing("capabilities") {
            return Err("capset: not permitted".to_string().into());
        }
        Ok(())
    }

    fn landlock(
        &self,
        rules: &LandlockRules,
        host_abi: u32,
        share: bool,
    ) -> Result<Option<OwnedFd>, LandlockError> {
        self.calls.borrow_mut().push(Call::Landlock {
            readable: rules.readable.clone(),
            writable: rules.writable.clone(),
            abi: host_abi,
            share,
        });
        if self.failing("landlock") {
            return Err(LandlockError::Open {
                path: "/".into(),
                errno: rustix::io::Errno::ACCESS,
            });
        }
        Ok(share.then(|| std::fs::File::open("/dev/null").unwrap().into()))
    }

    fn seccomp(&self, filters: &[BpfProgram]) -> Result<(), SeccompError> {
        self.calls.borrow_mut().push(Call::Seccomp(filters.len()));
        if self.failing("seccomp") {
            return Err(SeccompError::NotifyDefault);
        }
        Ok(())
    }

    fn exited(&self, pidfd: BorrowedFd<'_>) -> bool {
        use std::os::fd::AsRawFd;
        self.exited.contains(&pidfd.as_raw_fd())
    }
}
