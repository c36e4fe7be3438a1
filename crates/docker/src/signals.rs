//! Signal names as Docker takes them (`SIGTERM`, `TERM`, `15`).

/// The signal number of a Docker signal spec.
pub fn parse(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let name = s.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    Some(match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "WINCH" => libc::SIGWINCH,
        "ALRM" => libc::SIGALRM,
        "PIPE" => libc::SIGPIPE,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(parse("SIGTERM"), Some(15));
        assert_eq!(parse("term"), Some(15));
        assert_eq!(parse("9"), Some(9));
        assert_eq!(parse("KILL"), Some(9));
        assert_eq!(parse("NOPE"), None);
        assert_eq!(parse("0"), None);
    }
}
