//! Seccomp: the default profile as an OCI `linux.seccomp` section, and its compilation into BPF
//! with `seccompiler`.
//!
//! libcontainer built without libseccomp ignores the spec's seccomp section, so agentrun's
//! executor applies it: [`compile`] turns any OCI seccomp section (ours or one from a
//! containerd-provided `config.json`) into a stack of BPF programs. seccompiler filters have
//! one match action each, so the section's rules are grouped by action into one filter per
//! action; the kernel runs every filter of the stack and the most restrictive answer wins,
//! which is exactly libseccomp's semantics for a single filter with several actions. The
//! arguments of one rule are ANDed (runc ORs repeated conditions on the same argument; agentrun
//! does not, which is what lets one rule say "none of these values").
//!
//! Under the stack sits a small hand-written filter, [`abi_guard`]: seccompiler checks the
//! audit architecture (a foreign one kills the process) but matches syscall numbers exactly
//! and cannot express a range, so on x86_64 a number with the x32 bit (`0x40000000 | nr`)
//! would match no deny rule and pass every filter on kernels built with x32 support. The guard
//! refuses the whole x32 range with EPERM (never the kernel's own ENOSYS, so a test can tell
//! the filter did it) and kills any foreign architecture (i386 through `int 0x80`), whatever
//! the section's `architectures` list: rules are compiled for the native ABI only.
//!
//! Arguments the kernel reads as 32-bit (`ioctl`'s request, `personality`, socket families)
//! are compared so that garbage in the upper half cannot slip past: a deny rule on a value
//! masks the low 32 bits (`ioctl(fd, 0x1_0000_5412)` is TIOCSTI to the kernel), and an allow
//! list ("none of these values") compares all 64 bits, so any upper bits make it a denial.
//!
//! `SCMP_ACT_NOTIFY` (seccomp user notification) has no seccompiler action: its rules are
//! compiled apart by [`compile_with_notify`] into one more filter, which has to be installed
//! with `SECCOMP_FILTER_FLAG_NEW_LISTENER` by [`install_with_listener`] (a raw seccomp(2)) so
//! that the caller gets the listener fd to hand to a supervisor. [`compile`] refuses it.

use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::str::FromStr;

use agentrun_policy::{SocketPolicy, PERSONALITY_ALLOWED};
use oci_spec::runtime::{
    LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder, LinuxSeccompBuilder,
    LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};
use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
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

/// `AUDIT_ARCH_*` of the native ABI (linux/audit.h: `EM_* | __AUDIT_ARCH_64BIT |
/// __AUDIT_ARCH_LE`); the libc crate does not define them.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_00b7;
/// `__X32_SYSCALL_BIT`: x32 syscalls are x86_64 syscalls with this bit set in the number.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const EPERM: u32 = libc::EPERM as u32;
const ENOSYS: u32 = libc::ENOSYS as u32;
/// A socket family the profile does not allow fails as if the kernel lacked it, the answer
/// systemd's `RestrictAddressFamilies=` gives too: programs probing for a family (OpenSSL's
/// AF_ALG engine, Python's socket tests, glibc's resolver) treat it as "not available" and go
/// on, where EPERM reads as a hard failure to some of them.
const EAFNOSUPPORT: u32 = libc::EAFNOSUPPORT as u32;
/// A netlink protocol the profile does not allow fails as on a kernel built without it.
const EPROTONOSUPPORT: u32 = libc::EPROTONOSUPPORT as u32;

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

/// The default profile: allow everything except
/// - the listed dangerous syscalls (EPERM);
/// - namespace-creating `clone` (EPERM), `clone3` (ENOSYS, so libc falls back to `clone`,
///   whose flags a filter can inspect);
/// - the terminal-injection ioctls TIOCSTI/TIOCLINUX, on the low 32 bits of the request
///   (EPERM);
/// - `personality` with any value but [`PERSONALITY_ALLOWED`] (EPERM);
/// - `socket`/`socketpair` with a family `sockets` does not allow (EAFNOSUPPORT), and netlink
///   sockets of a protocol it does not allow (EPROTONOSUPPORT).
pub fn default_profile(
    denied: &[&str],
    sockets: &SocketPolicy,
) -> Result<LinuxSeccomp, SeccompError> {
    let mut syscalls: Vec<LinuxSyscall> = vec![
        errno_rule(denied, EPERM, Vec::new())?,
        errno_rule(&["clone3"], ENOSYS, Vec::new())?,
    ];
    for flag in CLONE_NS_FLAGS {
        // (flags & FLAG) == FLAG
        let arg = seccomp_arg(0, LinuxSeccompOperator::ScmpCmpMaskedEq, *flag, Some(*flag))?;
        syscalls.push(errno_rule(&["clone"], EPERM, vec![arg])?);
    }
    // (`as u64`: libc types the requests c_ulong on glibc, c_int on musl.)
    #[allow(clippy::unnecessary_cast)]
    for req in [libc::TIOCSTI as u64, libc::TIOCLINUX as u64] {
        // (request & 0xffffffff) == REQ: the kernel's ioctl takes an unsigned int.
        let arg = seccomp_arg(
            1,
            LinuxSeccompOperator::ScmpCmpMaskedEq,
            u64::from(u32::MAX),
            Some(req),
        )?;
        syscalls.push(errno_rule(&["ioctl"], EPERM, vec![arg])?);
    }
    syscalls.push(errno_rule(
        &["personality"],
        EPERM,
        none_of(0, PERSONALITY_ALLOWED.iter().copied())?,
    )?);
    syscalls.push(errno_rule(
        &["socket", "socketpair"],
        EAFNOSUPPORT,
        none_of(0, sockets.families.iter().map(|f| u64::from(*f)))?,
    )?);
    if let Some(protocols) = sockets.netlink_protocols.as_ref().filter(|_| {
        sockets
            .families
            .contains(&agentrun_policy::seccomp::AF_NETLINK)
    }) {
        let mut args = vec![seccomp_arg(
            0,
            LinuxSeccompOperator::ScmpCmpEq,
            u64::from(agentrun_policy::seccomp::AF_NETLINK),
            None,
        )?];
        args.extend(none_of(2, protocols.iter().map(|p| u64::from(*p)))?);
        syscalls.push(errno_rule(&["socket"], EPROTONOSUPPORT, args)?);
    }
    Ok(LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .syscalls(syscalls)
        .build()?)
}

/// One argument comparison.
fn seccomp_arg(
    index: usize,
    op: LinuxSeccompOperator,
    value: u64,
    value_two: Option<u64>,
) -> Result<LinuxSeccompArg, SeccompError> {
    let mut b = LinuxSeccompArgBuilder::default()
        .index(index)
        .value(value)
        .op(op);
    if let Some(v) = value_two {
        b = b.value_two(v);
    }
    Ok(b.build()?)
}

/// Conditions (ANDed in one rule) that argument `index` is none of `allowed`, compared on all
/// 64 bits: a value with upper bits set matches none, so it is denied.
fn none_of(
    index: usize,
    allowed: impl Iterator<Item = u64>,
) -> Result<Vec<LinuxSeccompArg>, SeccompError> {
    allowed
        .map(|v| seccomp_arg(index, LinuxSeccompOperator::ScmpCmpNe, v, None))
        .collect()
}

/// A rule failing `names` with `errno` when all of `args` match (always, when empty).
fn errno_rule(
    names: &[&str],
    errno: u32,
    args: Vec<LinuxSeccompArg>,
) -> Result<LinuxSyscall, SeccompError> {
    let mut b = LinuxSyscallBuilder::default()
        .names(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(errno);
    if !args.is_empty() {
        b = b.args(args);
    }
    Ok(b.build()?)
}

/// The hand-written filter installed under every compiled section (see the module doc):
/// a foreign audit architecture kills the process, an x32 syscall number fails with EPERM,
/// everything else is left to the other filters.
pub fn abi_guard() -> BpfProgram {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    // Offsets in struct seccomp_data { int nr; __u32 arch; __u64 ip; __u64 args[6]; }.
    const NR: u32 = 0;
    const ARCH_AT: u32 = 4;
    let op = |code: u16, k: u32| sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u16, k: u32, jt: u8, jf: u8| sock_filter { code, jt, jf, k };
    #[allow(unused_mut)]
    let mut program = vec![
        op(LD_W_ABS, ARCH_AT),
        jump(JEQ_K, AUDIT_ARCH_NATIVE, 1, 0),
        op(RET_K, libc::SECCOMP_RET_KILL_PROCESS),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
        program.extend([
            op(LD_W_ABS, NR),
            jump(JGE_K, X32_SYSCALL_BIT, 0, 1),
            op(RET_K, libc::SECCOMP_RET_ERRNO | EPERM),
        ]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    // Not an error: marks NR used on architectures without the x86_64-only rule.
    let _ = NR;
    program.push(op(RET_K, libc::SECCOMP_RET_ALLOW));
    program
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

/// Compiles an OCI seccomp section into the BPF programs to install, in order: the
/// [`abi_guard`] first, then one filter per action; a section with `SCMP_ACT_NOTIFY` rules is
/// refused (see [`compile_with_notify`]).
pub fn compile(section: &LinuxSeccomp) -> Result<Vec<BpfProgram>, SeccompError> {
    let mut programs = compile_on_top(section)?;
    programs.insert(0, abi_guard());
    Ok(programs)
}

/// The part of `run` that a process already under `base`'s filters still lacks, when there
/// is one that says it exactly: `Some(section)` if `run` and `base` both allow by default (with
/// the same architectures and flags, and only deny-type rules) and every rule of `base` is one
/// of `run`'s (compared per syscall name); the section then holds `run`'s other rules. `None`
/// otherwise: the caller installs all of `run`.
///
/// The kernel runs every filter of a stack and the most restrictive answer wins, so `base`'s
/// filters plus this section's give each syscall the answer `run`'s would: the rules are the
/// same set, grouped differently. A shell's cells use it ([`crate::inside::shell`]): they inherit the
/// shell's filter, which is the run's less what making a cell needs, and add only that part
/// (a few rules instead of the whole profile compiled and JIT-compiled again per cell).
pub fn narrowing(run: &LinuxSeccomp, base: &LinuxSeccomp) -> Option<LinuxSeccomp> {
    let allow = LinuxSeccompAction::ScmpActAllow;
    let plain = |s: &LinuxSeccomp| {
        s.default_action() == allow
            && s.listener_path().is_none()
            && s.syscalls().iter().flatten().all(|r| {
                !matches!(
                    r.action(),
                    LinuxSeccompAction::ScmpActAllow | LinuxSeccompAction::ScmpActNotify
                )
            })
    };
    if !plain(run)
        || !plain(base)
        || run.architectures() != base.architectures()
        || run.flags() != base.flags()
        || run.default_errno_ret() != base.default_errno_ret()
    {
        return None;
    }
    let run_rules = per_name(run);
    let base_rules = per_name(base);
    if !base_rules.iter().all(|r| run_rules.contains(r)) {
        return None;
    }
    let rest: Vec<LinuxSyscall> = run_rules
        .into_iter()
        .filter(|r| !base_rules.contains(r))
        .collect();
    let mut section = run.clone();
    section.set_syscalls(Some(rest));
    Some(section)
}

/// A section's rules, one per syscall name.
fn per_name(section: &LinuxSeccomp) -> Vec<LinuxSyscall> {
    section
        .syscalls()
        .iter()
        .flatten()
        .flat_map(|r| {
            r.names().iter().map(move |n| {
                let mut one = r.clone();
                one.set_names(vec![n.clone()]);
                one
            })
        })
        .collect()
}

/// Compiles a section (one without `SCMP_ACT_NOTIFY` rules) into the programs to install on
/// top of a stack that already starts with the [`abi_guard`]: one filter per action, no guard
/// again.
pub fn compile_on_top(section: &LinuxSeccomp) -> Result<Vec<BpfProgram>, SeccompError> {
    match action_filters(section)? {
        (programs, None) => Ok(programs),
        (_, Some(_)) => Err(SeccompError::UnsupportedAction(
            LinuxSeccompAction::ScmpActNotify,
        )),
    }
}

/// Compiles an OCI seccomp section into the BPF programs to install, in order (the
/// [`abi_guard`] first), and the filter of its `SCMP_ACT_NOTIFY` rules, if it has any, to
/// install with [`install_with_listener`].
pub fn compile_with_notify(
    section: &LinuxSeccomp,
) -> Result<(Vec<BpfProgram>, Option<BpfProgram>), SeccompError> {
    let (mut programs, notify) = action_filters(section)?;
    programs.insert(0, abi_guard());
    Ok((programs, notify))
}

/// A section's rules as one filter per action (and the notify filter, if any), without the
/// [`abi_guard`].
fn action_filters(
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

    fn default_stack() -> Vec<BpfProgram> {
        let section = default_profile(
            agentrun_policy::seccomp_denied_syscalls(),
            &SocketPolicy::default(),
        )
        .unwrap();
        compile(&section).unwrap()
    }

    #[test]
    fn default_profile_compiles_to_stacked_filters() {
        let progs = default_stack();
        // The ABI guard, then the EPERM, ENOSYS, EAFNOSUPPORT and EPROTONOSUPPORT groups.
        assert_eq!(progs.len(), 5);
        assert_eq!(progs[0], abi_guard());
        assert!(progs.iter().all(|p| !p.is_empty()));
    }

    /// A classic-BPF interpreter for the instructions seccompiler and [`abi_guard`] emit,
    /// run on a `struct seccomp_data` built by the test.
    fn run_program(program: &[sock_filter], nr: i32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes()); // ip
        for a in args {
            data.extend_from_slice(&a.to_ne_bytes());
        }
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let ins = &program[pc];
            pc += 1;
            let code = u32::from(ins.code);
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    let at = ins.k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => acc &= ins.k,
                c if c == libc::BPF_JMP | libc::BPF_JA => pc += ins.k as usize,
                c if c == libc::BPF_RET | libc::BPF_K => return ins.k,
                c if c & 0x07 == libc::BPF_JMP => {
                    let taken = match c & 0xf0 {
                        op if op == libc::BPF_JEQ => acc == ins.k,
                        op if op == libc::BPF_JGT => acc > ins.k,
                        op if op == libc::BPF_JGE => acc >= ins.k,
                        op if op == libc::BPF_JSET => acc & ins.k != 0,
                        op => panic!("unexpected jump op {op:#x}"),
                    };
                    pc += usize::from(if taken { ins.jt } else { ins.jf });
                }
                c => panic!("unexpected BPF instruction {c:#x}"),
            }
        }
    }

    /// What the kernel answers for a stack: every filter runs, the lowest action wins
    /// (compared as signed, so KILL_PROCESS beats everything).
    fn run_stack(stack: &[BpfProgram], nr: i64, arch: u32, args: [u64; 6]) -> u32 {
        stack
            .iter()
            .map(|p| run_program(p, nr as i32, arch, args))
            .min_by_key(|r| (r & libc::SECCOMP_RET_ACTION_FULL) as i32)
            .unwrap()
    }

    fn errno(e: i32) -> u32 {
        libc::SECCOMP_RET_ERRNO | e as u32
    }

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn x32_numbers_and_foreign_arches_are_refused() {
        let stack = default_stack();
        let native = AUDIT_ARCH_NATIVE;
        // unshare(CLONE_NEWUSER): denied natively, and through the x32 number too.
        let newuser = [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0];
        assert_eq!(
            run_stack(&stack, libc::SYS_unshare, native, newuser),
            errno(libc::EPERM)
        );
        assert_eq!(
            run_stack(&stack, 0x4000_0000 | libc::SYS_unshare, native, newuser),
            errno(libc::EPERM)
        );
        // Even a harmless x32 call: the whole range is refused, not only denied calls.
        assert_eq!(
            run_stack(&stack, 0x4000_0000 | libc::SYS_getpid, native, [0; 6]),
            errno(libc::EPERM)
        );
        // i386 (int 0x80 on x86_64): killed.
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        assert_eq!(
            run_stack(&stack, 20, AUDIT_ARCH_I386, [0; 6]),
            libc::SECCOMP_RET_KILL_PROCESS
        );
        assert_eq!(run_stack(&stack, libc::SYS_getpid, native, [0; 6]), ALLOW);
        // The guard alone, as every compiled section gets it.
        let allow_all = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActAllow)
            .build()
            .unwrap();
        let only_guard = compile(&allow_all).unwrap();
        assert_eq!(only_guard, vec![abi_guard()]);
        assert_eq!(
            run_stack(&only_guard, 0x4000_0000 | libc::SYS_read, native, [0; 6]),
            errno(libc::EPERM)
        );
    }

    #[test]
    fn tiocsti_is_matched_on_the_low_32_bits() {
        let stack = default_stack();
        let arch = AUDIT_ARCH_NATIVE;
        for req in [libc::TIOCSTI, libc::TIOCLINUX] {
            for high in [0u64, 1 << 32, 0xffff_ffff << 32] {
                assert_eq!(
                    run_stack(&stack, libc::SYS_ioctl, arch, [0, req | high, 0, 0, 0, 0]),
                    errno(libc::EPERM),
                    "{:#x}",
                    req | high
                );
            }
        }
        let tcgets = libc::TCGETS;
        assert_eq!(
            run_stack(&stack, libc::SYS_ioctl, arch, [0, tcgets, 0, 0, 0, 0]),
            ALLOW
        );
    }

    #[test]
    fn personality_takes_only_dockers_values() {
        let stack = default_stack();
        let arch = AUDIT_ARCH_NATIVE;
        for v in PERSONALITY_ALLOWED {
            assert_eq!(
                run_stack(&stack, libc::SYS_personality, arch, [*v, 0, 0, 0, 0, 0]),
                ALLOW,
                "{v:#x}"
            );
        }
        // READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, PER_BSD, an allowed value with upper bits.
        for v in [0x40_0000u64, 0x4_0000, 0x6, 1 << 32] {
            assert_eq!(
                run_stack(&stack, libc::SYS_personality, arch, [v, 0, 0, 0, 0, 0]),
                errno(libc::EPERM),
                "{v:#x}"
            );
        }
    }

    #[test]
    fn pidfd_getfd_is_denied() {
        let stack = default_stack();
        assert_eq!(
            run_stack(&stack, libc::SYS_pidfd_getfd, AUDIT_ARCH_NATIVE, [0; 6]),
            errno(libc::EPERM)
        );
    }

    #[test]
    fn socket_families_outside_the_policy_are_refused() {
        let stack = default_stack();
        let arch = AUDIT_ARCH_NATIVE;
        // socket(2) or socketpair(2) with `family`, SOCK_STREAM and `protocol`.
        let call = |stack: &[BpfProgram], nr: i64, family: u64, protocol: u64| {
            run_stack(stack, nr, arch, [family, 1, protocol, 0, 0, 0])
        };
        let socket = |stack: &[BpfProgram], family: u64, protocol: u64| {
            call(stack, libc::SYS_socket, family, protocol)
        };
        let pair = |family: i32| call(&stack, libc::SYS_socketpair, family as u64, 0);
        for family in [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6] {
            assert_eq!(socket(&stack, family as u64, 0), ALLOW);
            assert_eq!(pair(family), ALLOW);
        }
        let refused = errno(libc::EAFNOSUPPORT);
        for family in [
            libc::AF_VSOCK,
            libc::AF_PACKET,
            libc::AF_ALG,
            libc::AF_KEY,
            libc::AF_BLUETOOTH,
        ] {
            assert_eq!(socket(&stack, family as u64, 0), refused, "{family}");
            assert_eq!(pair(family), refused);
        }
        // An allowed family with upper bits (the kernel reads an int): refused.
        assert_eq!(socket(&stack, (1 << 32) | 1, 0), refused);
        assert_eq!(socket(&stack, (1 << 32) | 40, 0), refused);
        // Netlink: route only.
        let netlink = libc::AF_NETLINK as u64;
        assert_eq!(socket(&stack, netlink, libc::NETLINK_ROUTE as u64), ALLOW);
        for proto in [
            libc::NETLINK_AUDIT,
            libc::NETLINK_SOCK_DIAG,
            libc::NETLINK_GENERIC,
        ] {
            assert_eq!(
                socket(&stack, netlink, proto as u64),
                errno(libc::EPROTONOSUPPORT),
                "{proto}"
            );
        }
        // A profile that allows AF_ALG and all of netlink.
        let wider = SocketPolicy::with_families(&["alg", "netlink"]).unwrap();
        let section = default_profile(agentrun_policy::seccomp_denied_syscalls(), &wider).unwrap();
        let stack = compile(&section).unwrap();
        assert_eq!(socket(&stack, libc::AF_ALG as u64, 0), ALLOW);
        assert_eq!(
            socket(&stack, netlink, libc::NETLINK_SOCK_DIAG as u64),
            ALLOW
        );
        assert_eq!(socket(&stack, libc::AF_VSOCK as u64, 0), refused);
    }

    #[test]
    fn installed_stack_refuses_x32_numbers_in_a_child() {
        // The real kernel, not the interpreter: a forked child installs the default stack
        // and calls getpid through its x32 number. On kernels without x32 support the
        // kernel itself would answer ENOSYS; the filter answers EPERM first.
        let stack = default_stack();
        #[cfg(target_arch = "x86_64")]
        let nr = 0x4000_0000 | libc::SYS_getpid;
        #[cfg(not(target_arch = "x86_64"))]
        let nr = libc::SYS_pidfd_getfd;
        // SAFETY: fork in a test; the child only makes async-signal-safe calls and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: prctl and syscall with plain integer arguments, then _exit.
            unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                for p in &stack {
                    let prog = libc::sock_fprog {
                        len: p.len() as u16,
                        filter: p.as_ptr() as *mut libc::sock_filter,
                    };
                    if libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog) != 0 {
                        libc::_exit(100);
                    }
                }
                let r = libc::syscall(nr, 0, 0, 0);
                let e = *libc::__errno_location();
                libc::_exit(if r == -1 { e } else { 101 });
            }
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid out-pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), libc::EPERM);
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
        // The ABI guard and the allow filter.
        assert_eq!(compile(&section).unwrap().len(), 2);
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
        assert_eq!(
            programs,
            vec![abi_guard()],
            "only the ABI guard besides the notify filter"
        );
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
        // The ABI guard, then the default filter, which allows getcwd (so that the notify
        // filter decides).
        assert_eq!(programs.len(), 2);
        assert_eq!(programs[0], abi_guard());
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

    /// What the kernel answers for filters installed in `installed` order: it runs them newest
    /// first and keeps the first answer of the most restrictive action (so among two errnos of
    /// equal precedence, the newer filter's).
    fn kernel_answer(installed: &[BpfProgram], nr: i64, arch: u32, args: [u64; 6]) -> u32 {
        installed
            .iter()
            .rev()
            .map(|p| run_program(p, nr as i32, arch, args))
            .min_by_key(|r| (r & libc::SECCOMP_RET_ACTION_FULL) as i32)
            .unwrap()
    }

    #[test]
    fn a_cells_narrowing_on_top_of_its_shells_filter_answers_as_the_run_filter() {
        let widened = SocketPolicy::with_families(&["netlink", "vsock", "alg"]).unwrap();
        for sockets in [SocketPolicy::default(), widened] {
            let denied = agentrun_policy::seccomp_denied_syscalls();
            let run = default_profile(denied, &sockets).unwrap();
            let shell = crate::inside::shell::shell_filter(denied, &sockets, false).unwrap();
            let rest = narrowing(&run, &shell).expect("the shell's rules are the run's");
            // Only what making a cell needs is left to add: a handful of rules.
            let names: Vec<&String> = rest
                .syscalls()
                .iter()
                .flatten()
                .flat_map(|r| r.names())
                .collect();
            assert!(names.len() <= 8, "{names:?}");
            let shell_progs = compile(&shell).unwrap();
            let cell: Vec<BpfProgram> = shell_progs
                .iter()
                .cloned()
                .chain(compile_on_top(&rest).unwrap())
                .collect();
            let before: Vec<BpfProgram> = shell_progs
                .iter()
                .cloned()
                .chain(compile(&run).unwrap())
                .collect();
            let run_alone = compile(&run).unwrap();
            assert!(cell.len() < before.len());
            let mut patterns: Vec<[u64; 6]> = vec![[0; 6], [u64::MAX; 6], [1, 2, 3, 4, 5, 6]];
            for f in CLONE_NS_FLAGS {
                patterns.push([*f | libc::SIGCHLD as u64, 0, 0, 0, 0, 0]);
            }
            patterns.push([
                (libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::SIGCHLD)
                    as u64,
                0,
                0,
                0,
                0,
                0,
            ]);
            for req in [libc::TIOCSTI, libc::TIOCLINUX, 0x1_0000_5412] {
                patterns.push([1, req, 0, 0, 0, 0]);
            }
            for p in PERSONALITY_ALLOWED
                .iter()
                .chain(&[0x0040_0000, 0xffff_ffff])
            {
                patterns.push([*p, 0, 0, 0, 0, 0]);
            }
            let mut socket_patterns = patterns.clone();
            for family in 0..48u64 {
                for protocol in [0u64, 4, 9, 16] {
                    socket_patterns.push([family, 1, protocol, 0, 0, 0]);
                }
            }
            let mut arches = vec![(AUDIT_ARCH_NATIVE, 0i64), (0x4000_0003, 0)];
            #[cfg(target_arch = "x86_64")]
            arches.push((AUDIT_ARCH_NATIVE, i64::from(X32_SYSCALL_BIT)));
            for nr in 0..=470i64 {
                let socket = nr == libc::SYS_socket || nr == libc::SYS_socketpair;
                for (arch, bit) in &arches {
                    for args in if socket { &socket_patterns } else { &patterns } {
                        let nr = nr | bit;
                        let want = kernel_answer(&before, nr, *arch, *args);
                        assert_eq!(
                            kernel_answer(&cell, nr, *arch, *args),
                            want,
                            "syscall {nr:#x} arch {arch:#x} args {args:x?}"
                        );
                        assert_eq!(kernel_answer(&run_alone, nr, *arch, *args), want);
                    }
                }
            }
        }
    }

    #[test]
    fn no_narrowing_when_the_base_is_not_part_of_the_run() {
        let denied = agentrun_policy::seccomp_denied_syscalls();
        let run = default_profile(denied, &SocketPolicy::default()).unwrap();
        // A base that denies what the run allows: installing the rest on it would deny more.
        let mut wider: Vec<&str> = denied.to_vec();
        wider.push("getpid");
        let base = default_profile(&wider, &SocketPolicy::default()).unwrap();
        assert!(narrowing(&run, &base).is_none());
        // Other socket families: the base's socket rule is not the run's.
        let other =
            default_profile(denied, &SocketPolicy::with_families(&["vsock"]).unwrap()).unwrap();
        assert!(narrowing(&run, &other).is_none());
        // A default-deny run is never narrowed.
        let mut strict = run.clone();
        strict.set_default_action(LinuxSeccompAction::ScmpActErrno);
        assert!(narrowing(&strict, &run).is_none());
        // The same section: nothing to add.
        let same = narrowing(&run, &run).unwrap();
        assert!(same.syscalls().as_ref().is_none_or(|s| s.is_empty()));
    }
}
