//! Seccomp: the default profile as an OCI `linux.seccomp` section, and its compilation into BPF
//! with `seccompiler`.
//!
//! libcontainer built without libseccomp ignores the spec's seccomp section, so agentrun's
//! executor applies it: [`compile`] turns any OCI seccomp section (ours or one from a
//! containerd-provided `config.json`) into a stack of BPF programs. seccompiler filters have
//! one match action each, so the section's rules are grouped by action into one filter per
//! action; the kernel runs every filter of the stack and the most restrictive answer wins,
//! which is exactly libseccomp's semantics for a single filter with several actions.

use std::collections::BTreeMap;
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

/// Compiles an OCI seccomp section into the BPF programs to install, in order.
pub fn compile(section: &LinuxSeccomp) -> Result<Vec<BpfProgram>, SeccompError> {
    let default = action(section.default_action(), section.default_errno_ret())?;
    // Group non-default rules by their action.
    let mut groups: Vec<(SeccompAction, RuleMap)> = Vec::new();
    let mut allowed = RuleMap::new();
    for sc in section.syscalls().iter().flatten() {
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
    Ok(programs)
}

/// Installs compiled programs on the calling thread (requires no_new_privs or CAP_SYS_ADMIN).
pub fn install(programs: &[BpfProgram]) -> Result<(), SeccompError> {
    for p in programs {
        seccompiler::apply_filter(p)?;
    }
    Ok(())
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
    fn notify_is_refused_clearly() {
        let section = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActNotify)
            .build()
            .unwrap();
        assert!(matches!(
            compile(&section),
            Err(SeccompError::UnsupportedAction(_))
        ));
    }
}
