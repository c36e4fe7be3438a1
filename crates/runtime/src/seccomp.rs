//! Seccomp: the default profile as an OCI `linux.seccomp` section, and its compilation into BPF
//! with `seccompiler`.
//!
//! libcontainer built without libseccomp ignores the spec's seccomp section, so agentrun's
//! executor applies it: [`compile`] turns any OCI seccomp section (ours or one from a
//! containerd-provided `config.json`) into a stack of BPF programs. seccompiler filters have
//! one match action each, so the section's rules are grouped by action into one filter per
//! action; the kernel runs every filter of the stack and the most restrictive answer wins,
//! which is exactly libseccomp's semantics for a single filter with several actions.
//!
//! `SCMP_ACT_NOTIFY` (seccomp user notification) has no seccompiler action: its rules are
//! compiled apart by [`compile_with_notify`] into one more filter, which has to be installed
//! with `SECCOMP_FILTER_FLAG_NEW_LISTENER` by [`install_with_listener`] (a raw seccomp(2)) so
//! that the caller gets the listener fd to hand to a supervisor. [`compile`] refuses it.

use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::str::FromStr;

use oci_spec::runtime::{
    LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder, LinuxSeccompBuilder,
    LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Errors compiling or installing a seccomp profile.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp action {0:?} is not supported by agentrun")]
    UnsupportedAction(LinuxSeccompAction),
    #[error("SCMP_ACT_NOTIFY cannot be the default seccomp action (every syscall would wait for the agent, including the ones that hand it the notify fd)")]
    NotifyDefault,
    #[error("installing seccomp notify filter: {0}")]
    InstallListener(std::io::Error),
    #[error("seccomp rule for {0}: argument index {1} out of range")]
    BadArgument(String, usize),
    #[error("seccomp filter: {0}")]
    Compile(#[from] seccompiler::BackendError),
    #[error("installing seccomp filter: {0}")]
    Install(#[from] seccompiler::Error),
    #[error("building seccomp section: {0}")]
    Spec(#[from] oci_spec::OciSpecError),
}

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

const EPERM: u32 = libc::EPERM as u32;
const ENOSYS: u32 = libc::ENOSYS as u32;

/// Namespace-creating clone flags: a sandbox may fork and make threads, never new namespaces.
const CLONE_NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

/// The default profile: allow everything except the listed dangerous syscalls (EPERM),
/// namespace-creating `clone` (EPERM), `clone3` (ENOSYS, so libc falls back to `clone`, whose
/// flags a filter can inspect), and the terminal-injection ioctls TIOCSTI/TIOCLINUX (EPERM).
pub fn default_profile(denied: &[&str]) -> Result<LinuxSeccomp, SeccompError> {
    let mut syscalls: Vec<LinuxSyscall> = vec![
        errno_rule(denied, EPERM, None)?,
        errno_rule(&["clone3"], ENOSYS, None)?,
    ];
    for flag in CLONE_NS_FLAGS {
        // (flags & FLAG) == FLAG
        let arg = LinuxSeccompArgBuilder::default()
            .index(0usize)
            .value(*flag)
            .value_two(*flag)
            .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
            .build()?;
        syscalls.push(errno_rule(&["clone"], EPERM, Some(arg))?);
    }
    for req in [libc::TIOCSTI, libc::TIOCLINUX] {
        let arg = LinuxSeccompArgBuilder::default()
            .index(1usize)
            .value(req)
            .op(LinuxSeccompOperator::ScmpCmpEq)
            .build()?;
        syscalls.push(errno_rule(&["ioctl"], EPERM, Some(arg))?);
    }
    Ok(LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .syscalls(syscalls)
        .build()?)
}

/// A rule failing `names` with `errno`, when `arg` matches if one is given.
fn errno_rule(
    names: &[&str],
    errno: u32,
    arg: Option<LinuxSeccompArg>,
) -> Result<LinuxSyscall, SeccompError> {
    let mut b = LinuxSyscallBuilder::default()
        .names(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(errno);
    if let Some(arg) = arg {
        b = b.args(vec![arg]);
    }
    Ok(b.build()?)
}

fn action(a: LinuxSeccompAction, errno: Option<u32>) -> Result<SeccompAction, SeccompError> {
    Ok(match a {
        LinuxSeccompAction::ScmpActAllow => SeccompAction::Allow,
        LinuxSeccompAction::ScmpActErrno => SeccompAction::Errno(errno.unwrap_or(EPERM)),
        LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => {
            SeccompAction::KillThread
        }
        LinuxSeccompAction::ScmpActKillProcess => SeccompAction::KillProcess,
        LinuxSeccompAction::ScmpActTrap => SeccompAction::Trap,
        LinuxSeccompAction::ScmpActLog => SeccompAction::Log,
        LinuxSeccompAction::ScmpActTrace => SeccompAction::Trace(errno.unwrap_or(0)),
        other => return Err(SeccompError::UnsupportedAction(other)),
    })
}

fn rule(sc: &LinuxSyscall, name: &str) -> Result<SeccompRule, SeccompError> {
    let mut conditions = Vec::new();
    for arg in sc.args().iter().flatten() {
        let index = u8::try_from(arg.index())
            .ok()
            .filter(|i| *i < 6)
            .ok_or_else(|| SeccompError::BadArgument(name.to_owned(), arg.index()))?;
        let (op, value) = match arg.op() {
            LinuxSeccompOperator::ScmpCmpNe => (SeccompCmpOp::Ne, arg.value()),
            LinuxSeccompOperator::ScmpCmpLt => (SeccompCmpOp::Lt, arg.value()),
            LinuxSeccompOperator::ScmpCmpLe => (SeccompCmpOp::Le, arg.value()),
            LinuxSeccompOperator::ScmpCmpEq => (SeccompCmpOp::Eq, arg.value()),
            LinuxSeccompOperator::ScmpCmpGe => (SeccompCmpOp::Ge, arg.value()),
            LinuxSeccompOperator::ScmpCmpGt => (SeccompCmpOp::Gt, arg.value()),
            // OCI: (arg & value) == valueTwo; seccompiler: (arg & mask) == value.
            LinuxSeccompOperator::ScmpCmpMaskedEq => (
                SeccompCmpOp::MaskedEq(arg.value()),
                arg.value_two().unwrap_or(0),
            ),
        };
        conditions.push(SeccompCondition::new(
            index,
            SeccompCmpArgLen::Qword,
            op,
            value,
        )?);
    }
    Ok(SeccompRule::new(conditions)?)
}

/// Rules for one syscall within one action group.
enum Match {
    /// The syscall matches whatever its arguments.
    Always,
    /// The syscall matches when any of these rules matches.
    When(Vec<SeccompRule>),
}

type RuleMap = BTreeMap<i64, Match>;

/// Adds `sc`'s names to a per-syscall rule map; unknown names (not on this architecture) are
/// skipped, as libseccomp does.
fn add_rules(map: &mut RuleMap, sc: &LinuxSyscall) -> Result<(), SeccompError> {
    let unconditional = sc.args().as_ref().is_none_or(|a| a.is_empty());
    for name in sc.names() {
        let Ok(nr) = syscalls::Sysno::from_str(name) else {
            continue;
        };
        let nr = nr.id() as i64;
        if unconditional {
            map.insert(nr, Match::Always);
            continue;
        }
        let r = rule(sc, name)?;
        match map.entry(nr).or_insert_with(|| Match::When(Vec::new())) {
            Match::Always => {}
            Match::When(rules) => rules.push(r),
        }
    }
    Ok(())
}

/// The map seccompiler takes: an empty rule list matches unconditionally.
fn to_filter_rules(map: RuleMap) -> BTreeMap<i64, Vec<SeccompRule>> {
    map.into_iter()
        .map(|(nr, m)| match m {
            Match::Always => (nr, Vec::new()),
            Match::When(rules) => (nr, rules),
        })
        .collect()
}

/// Compiles an OCI seccomp section into the BPF programs to install, in order; a section
/// with `SCMP_ACT_NOTIFY` rules is refused (see [`compile_with_notify`]).
pub fn compile(section: &LinuxSeccomp) -> Result<Vec<BpfProgram>, SeccompError> {
    match compile_with_notify(section)? {
        (programs, None) => Ok(programs),
        (_, Some(_)) => Err(SeccompError::UnsupportedAction(
            LinuxSeccompAction::ScmpActNotify,
        )),
    }
}

/// Compiles an OCI seccomp section into the BPF programs to install, in order, and the
/// filter of its `SCMP_ACT_NOTIFY` rules, if it has any, to install with
/// [`install_with_listener`].
pub fn compile_with_notify(
    section: &LinuxSeccomp,
) -> Result<(Vec<BpfProgram>, Option<BpfProgram>), SeccompError> {
    if section.default_action() == LinuxSeccompAction::ScmpActNotify {
        return Err(SeccompError::NotifyDefault);
    }
    let default = action(section.default_action(), section.default_errno_ret())?;
    // Group non-default rules by their action.
    let mut groups: Vec<(SeccompAction, RuleMap)> = Vec::new();
    let mut allowed = RuleMap::new();
    let mut notified = RuleMap::new();
    for sc in section.syscalls().iter().flatten() {
        if sc.action() == LinuxSeccompAction::ScmpActNotify {
            // The deny-by-default filter lets them through to the notify filter.
            add_rules(&mut allowed, sc)?;
            add_rules(&mut notified, sc)?;
            continue;
        }
        let act = action(sc.action(), sc.errno_ret())?;
        if act == SeccompAction::Allow {
            add_rules(&mut allowed, sc)?;
            continue;
        }
        if act == default {
            continue;
        }
        let idx = match groups.iter().position(|(a, _)| *a == act) {
            Some(i) => i,
            None => {
                groups.push((act.clone(), BTreeMap::new()));
                groups.len() - 1
            }
        };
        add_rules(&mut groups[idx].1, sc)?;
    }
    let mut programs = Vec::new();
    if default != SeccompAction::Allow {
        // Deny by default, allow the listed syscalls.
        let filter = SeccompFilter::new(
            to_filter_rules(allowed),
            default,
            SeccompAction::Allow,
            ARCH,
        )?;
        programs.push(BpfProgram::try_from(filter)?);
    }
    for (act, rules) in groups {
        if rules.is_empty() {
            continue;
        }
        let filter = SeccompFilter::new(to_filter_rules(rules), SeccompAction::Allow, act, ARCH)?;
        programs.push(BpfProgram::try_from(filter)?);
    }
    let notify = if notified.is_empty() {
        None
    } else {
        Some(notify_filter(notified)?)
    };
    Ok((programs, notify))
}

/// The data of the placeholder action the notify filter is compiled with: seccompiler has no
/// notify action, so the filter is compiled to return `SECCOMP_RET_TRACE | NOTIFY_PLACEHOLDER`
/// on a match, and those return instructions are rewritten to `SECCOMP_RET_USER_NOTIF`.
const NOTIFY_PLACEHOLDER: u32 = 0x4e7f;

/// A filter answering `SECCOMP_RET_USER_NOTIF` for `rules`, allowing everything else.
fn notify_filter(rules: RuleMap) -> Result<BpfProgram, SeccompError> {
    let placeholder = SeccompAction::Trace(NOTIFY_PLACEHOLDER);
    let filter = SeccompFilter::new(
        to_filter_rules(rules),
        SeccompAction::Allow,
        placeholder,
        ARCH,
    )?;
    let mut program = BpfProgram::try_from(filter)?;
    let placeholder_ret = libc::SECCOMP_RET_TRACE | NOTIFY_PLACEHOLDER;
    for insn in program.iter_mut() {
        if insn.code == (libc::BPF_RET | libc::BPF_K) as u16 && insn.k == placeholder_ret {
            insn.k = libc::SECCOMP_RET_USER_NOTIF;
        }
    }
    Ok(program)
}

/// Installs compiled programs on the calling thread (requires no_new_privs or CAP_SYS_ADMIN).
pub fn install(programs: &[BpfProgram]) -> Result<(), SeccompError> {
    for p in programs {
        seccompiler::apply_filter(p)?;
    }
    Ok(())
}

/// Installs `program` on the calling thread with `SECCOMP_FILTER_FLAG_NEW_LISTENER` and
/// returns the listener (close-on-exec): its holder receives the filter's notifications
/// (seccomp_unotify(2)). seccompiler cannot pass that flag, hence the raw syscall.
pub fn install_with_listener(program: &BpfProgram) -> Result<OwnedFd, SeccompError> {
    let filter: Vec<libc::sock_filter> = program
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let len = u16::try_from(filter.len()).map_err(|_| {
        SeccompError::InstallListener(std::io::Error::from_raw_os_error(libc::EINVAL))
    })?;
    let fprog = libc::sock_fprog {
        len,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points to `filter`, which outlives the call; the kernel copies the
    // program and only reads through the pointer.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(SeccompError::InstallListener(
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_profile_compiles_to_stacked_filters() {
        let section = default_profile(agentrun_policy::seccomp_denied_syscalls()).unwrap();
        let progs = compile(&section).unwrap();
        // EPERM group and ENOSYS group.
        assert_eq!(progs.len(), 2);
        assert!(progs.iter().all(|p| !p.is_empty()));
    }

    #[test]
    fn default_deny_profile_gets_an_allow_filter() {
        let section = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActErrno)
            .syscalls(vec![LinuxSyscallBuilder::default()
                .names(vec!["read".into(), "write".into(), "no_such_call".into()])
                .action(LinuxSeccompAction::ScmpActAllow)
                .build()
                .unwrap()])
            .build()
            .unwrap();
        assert_eq!(compile(&section).unwrap().len(), 1);
    }

    #[test]
    fn notify_is_refused_by_plain_compile() {
        assert!(matches!(
            compile(&notify_section(LinuxSeccompAction::ScmpActAllow)),
            Err(SeccompError::UnsupportedAction(_))
        ));
    }

    fn notify_section(default: LinuxSeccompAction) -> LinuxSeccomp {
        LinuxSeccompBuilder::default()
            .default_action(default)
            .syscalls(vec![LinuxSyscallBuilder::default()
                .names(vec!["getcwd".into()])
                .action(LinuxSeccompAction::ScmpActNotify)
                .build()
                .unwrap()])
            .build()
            .unwrap()
    }

    #[test]
    fn notify_rules_compile_to_a_user_notif_filter() {
        let (programs, notify) =
            compile_with_notify(&notify_section(LinuxSeccompAction::ScmpActAllow)).unwrap();
        assert!(programs.is_empty());
        let notify = notify.unwrap();
        let rets: Vec<u32> = notify
            .iter()
            .filter(|i| i.code == (libc::BPF_RET | libc::BPF_K) as u16)
            .map(|i| i.k)
            .collect();
        assert!(rets.contains(&libc::SECCOMP_RET_USER_NOTIF), "{rets:x?}");
        assert!(!rets.contains(&(libc::SECCOMP_RET_TRACE | NOTIFY_PLACEHOLDER)));
    }

    #[test]
    fn notified_syscalls_pass_the_deny_by_default_filter() {
        let (programs, notify) =
            compile_with_notify(&notify_section(LinuxSeccompAction::ScmpActErrno)).unwrap();
        // The default filter allows getcwd (so that the notify filter decides).
        assert_eq!(programs.len(), 1);
        assert!(notify.is_some());
    }

    #[test]
    fn notify_as_default_action_is_refused() {
        let section = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActNotify)
            .build()
            .unwrap();
        assert!(matches!(
            compile_with_notify(&section),
            Err(SeccompError::NotifyDefault)
        ));
    }
}
