//! Dockerfile -> build steps. Parsing is the `dockerfile-parser` crate's; this module turns its
//! instructions into [`Step`]s with line numbers, refuses what the builder does not do (with
//! the line and the instruction), and expands `$VAR`/`${VAR}`/`${VAR:-x}`/`${VAR:+x}` the way
//! Docker does for the instructions that take variables.

use std::collections::BTreeMap;

use dockerfile_parser::{Dockerfile, Instruction, ShellOrExecExpr};

use crate::BuildError;

/// A command in shell form (run through the shell) or exec form (argv as written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandForm {
    Shell(String),
    Exec(Vec<String>),
}

impl CommandForm {
    fn from_expr(e: &ShellOrExecExpr) -> Self {
        match e {
            ShellOrExecExpr::Shell(s) => CommandForm::Shell(s.to_string().trim().to_owned()),
            ShellOrExecExpr::Exec(a) => {
                CommandForm::Exec(a.as_str_vec().into_iter().map(str::to_owned).collect())
            }
        }
    }

    /// The argv: shell form goes through `/bin/sh -c`.
    pub fn argv(&self) -> Vec<String> {
        match self {
            CommandForm::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
            CommandForm::Exec(v) => v.clone(),
        }
    }
}

/// One instruction, ready to execute. Values that take variables are expanded at execution
/// time (they depend on earlier ENV/ARG).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    From {
        image: String,
    },
    Run(CommandForm),
    Cmd(CommandForm),
    Entrypoint(CommandForm),
    Workdir(String),
    Env(Vec<(String, String)>),
    Arg {
        name: String,
        default: Option<String>,
    },
    Label(Vec<(String, String)>),
    Expose(Vec<String>),
    User(String),
    StopSignal(String),
    Copy {
        sources: Vec<String>,
        dest: String,
        chown: Option<String>,
        /// ADD: local tar archives are unpacked at the destination.
        add: bool,
    },
}

/// A step and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub line: usize,
    /// The instruction as written (for "Step i/N : ..." lines).
    pub text: String,
    pub step: Step,
}

/// Parses a Dockerfile into steps.
pub fn parse(text: &str) -> Result<Vec<Located>, BuildError> {
    let df =
        Dockerfile::parse(text).map_err(|e| BuildError::Dockerfile(one_line(&e.to_string())))?;
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let mut steps = Vec::new();
    let mut froms = 0;
    for ins in &df.instructions {
        let span = match ins {
            Instruction::From(i) => i.span,
            Instruction::Arg(i) => i.span,
            Instruction::Label(i) => i.span,
            Instruction::Run(i) => i.span,
            Instruction::Entrypoint(i) => i.span,
            Instruction::Cmd(i) => i.span,
            Instruction::Copy(i) => i.span,
            Instruction::Env(i) => i.span,
            Instruction::Misc(i) => i.span,
        };
        let line = line_of(span.start);
        let raw = &text[span.start..span.end.min(text.len())];
        let text_one = one_line(&raw.replace("\\\n", " "));
        let bad = |why: String| BuildError::Dockerfile(format!("line {line}: {why}"));
        let step = match ins {
            Instruction::From(f) => {
                froms += 1;
                if froms > 1 {
                    return Err(bad(
                        "multi-stage builds (a second FROM) are not supported".into()
                    ));
                }
                if !f.flags.is_empty() {
                    return Err(bad("FROM flags (--platform, ...) are not supported".into()));
                }
                Step::From {
                    image: f.image.content.clone(),
                }
            }
            Instruction::Arg(a) => Step::Arg {
                name: a.name.content.clone(),
                default: a.value.as_ref().map(|v| v.content.clone()),
            },
            Instruction::Label(l) => Step::Label(
                l.labels
                    .iter()
                    .map(|l| (l.name.content.clone(), l.value.content.clone()))
                    .collect(),
            ),
            Instruction::Run(r) => Step::Run(CommandForm::from_expr(&r.expr)),
            Instruction::Cmd(c) => Step::Cmd(CommandForm::from_expr(&c.expr)),
            Instruction::Entrypoint(e) => Step::Entrypoint(CommandForm::from_expr(&e.expr)),
            Instruction::Env(e) => Step::Env(
                e.vars
                    .iter()
                    .map(|v| (v.key.content.clone(), unquote(&v.value.to_string())))
                    .collect(),
            ),
            Instruction::Copy(c) => {
                let mut chown = None;
                for f in &c.flags {
                    match f.name.content.as_str() {
                        "chown" => chown = Some(f.value.content.clone()),
                        other => return Err(bad(format!("COPY --{other} is not supported"))),
                    }
                }
                Step::Copy {
                    sources: c.sources.iter().map(|s| s.content.clone()).collect(),
                    dest: c.destination.content.clone(),
                    chown,
                    add: false,
                }
            }
            Instruction::Misc(m) => {
                let name = m.instruction.content.to_ascii_uppercase();
                let args = m.arguments.to_string().trim().to_owned();
                match name.as_str() {
                    "WORKDIR" => Step::Workdir(args),
                    "EXPOSE" => Step::Expose(args.split_whitespace().map(str::to_owned).collect()),
                    "USER" => Step::User(args),
                    "STOPSIGNAL" => Step::StopSignal(args),
                    "MAINTAINER" => Step::Label(vec![("maintainer".into(), args)]),
                    "ADD" => {
                        let (chown, rest) = strip_chown(&args).map_err(|e| bad(e.to_string()))?;
                        let mut words = split_sources(&rest);
                        if words.len() < 2 {
                            return Err(bad("ADD needs a source and a destination".into()));
                        }
                        let dest = words.pop().expect("two words");
                        Step::Copy {
                            sources: words,
                            dest,
                            chown,
                            add: true,
                        }
                    }
                    other => {
                        return Err(bad(format!(
                            "unknown or unsupported instruction {other} (this builder does FROM, RUN, CMD, ENTRYPOINT, WORKDIR, ENV, ARG, LABEL, EXPOSE, USER, STOPSIGNAL, COPY, ADD)"
                        )))
                    }
                }
            }
        };
        steps.push(Located {
            line,
            text: text_one,
            step,
        });
    }
    match steps
        .iter()
        .position(|s| matches!(s.step, Step::From { .. }))
    {
        None => Err(BuildError::Dockerfile("no FROM instruction".into())),
        Some(i)
            if steps[..i]
                .iter()
                .any(|s| !matches!(s.step, Step::Arg { .. })) =>
        {
            Err(BuildError::Dockerfile(format!(
                "line {}: only ARG may come before FROM",
                steps[0].line
            )))
        }
        Some(_) => Ok(steps),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A flag of ADD other than `--chown`.
#[derive(Debug, thiserror::Error)]
#[error("ADD --{0} is not supported")]
struct UnsupportedAddFlag(String);

/// `--chown=X` at the start of ADD's arguments.
fn strip_chown(args: &str) -> Result<(Option<String>, String), UnsupportedAddFlag> {
    let mut chown = None;
    let mut rest = args.trim();
    while let Some(flag) = rest.strip_prefix("--") {
        let (word, tail) = flag.split_once(char::is_whitespace).unwrap_or((flag, ""));
        match word.split_once('=') {
            Some(("chown", v)) => chown = Some(v.to_owned()),
            _ => return Err(UnsupportedAddFlag(word.to_owned())),
        }
        rest = tail.trim_start();
    }
    Ok((chown, rest.to_owned()))
}

/// ADD's sources: JSON array form or whitespace-separated.
fn split_sources(s: &str) -> Vec<String> {
    if s.starts_with('[') {
        if let Ok(v) = serde_json::from_str::<Vec<String>>(s) {
            return v;
        }
    }
    s.split_whitespace().map(str::to_owned).collect()
}

fn unquote(s: &str) -> String {
    let t = s.trim();
    if t.len() >= 2
        && ((t.starts_with('"') && t.ends_with('"')) || (t.starts_with('\'') && t.ends_with('\'')))
    {
        t[1..t.len() - 1].replace("\\\"", "\"")
    } else {
        t.to_owned()
    }
}

/// Expands `$NAME`, `${NAME}`, `${NAME:-default}`, `${NAME:+alt}`; `\$` is a literal `$`.
/// Unknown variables expand to nothing, as in Docker.
pub fn expand(s: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'$') => {
                out.push('$');
                chars.next();
            }
            '$' => match chars.peek() {
                Some('{') => {
                    chars.next();
                    let mut inner = String::new();
                    for c in chars.by_ref() {
                        if c == '}' {
                            break;
                        }
                        inner.push(c);
                    }
                    if let Some((name, default)) = inner.split_once(":-") {
                        match vars.get(name).filter(|v| !v.is_empty()) {
                            Some(v) => out.push_str(v),
                            None => out.push_str(&expand(default, vars)),
                        }
                    } else if let Some((name, alt)) = inner.split_once(":+") {
                        if vars.get(name).is_some_and(|v| !v.is_empty()) {
                            out.push_str(&expand(alt, vars));
                        }
                    } else if let Some(v) = vars.get(&inner) {
                        out.push_str(v);
                    }
                }
                Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
                    let mut name = String::new();
                    while let Some(&c) = chars.peek() {
                        if c.is_ascii_alphanumeric() || c == '_' {
                            name.push(c);
                            chars.next();
                        } else {
                            break;
                        }
                    }
                    if let Some(v) = vars.get(&name) {
                        out.push_str(v);
                    }
                }
                _ => out.push('$'),
            },
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_code_interpreter_dockerfile() {
        let steps = parse(
            "FROM python:3.12-alpine\n# deps\nRUN pip install requests \\\n    beautifulsoup4\nWORKDIR /workspace\n",
        )
        .unwrap();
        assert_eq!(steps.len(), 3);
        assert_eq!(
            steps[0].step,
            Step::From {
                image: "python:3.12-alpine".into()
            }
        );
        assert_eq!(steps[1].line, 3);
        assert_eq!(
            steps[1].step,
            Step::Run(CommandForm::Shell(
                "pip install requests     beautifulsoup4".into()
            ))
        );
        assert_eq!(steps[2].step, Step::Workdir("/workspace".into()));
    }

    #[test]
    fn forms_and_instructions() {
        let steps = parse(
            "ARG BASE=busybox\nFROM $BASE\nENV A=1 B=\"two words\"\nCMD [\"python3\", \"-c\", \"print(1)\"]\nENTRYPOINT /bin/sh\nEXPOSE 8888/tcp 80\nLABEL a=b\nCOPY --chown=1:2 src/ /dst/\nADD x.tar /opt/\nUSER 1000\n",
        )
        .unwrap();
        let kinds: Vec<_> = steps.iter().map(|s| s.step.clone()).collect();
        assert_eq!(
            kinds[2],
            Step::Env(vec![
                ("A".into(), "1".into()),
                ("B".into(), "two words".into())
            ])
        );
        assert_eq!(
            kinds[3],
            Step::Cmd(CommandForm::Exec(vec![
                "python3".into(),
                "-c".into(),
                "print(1)".into()
            ]))
        );
        assert_eq!(kinds[5], Step::Expose(vec!["8888/tcp".into(), "80".into()]));
        assert_eq!(
            kinds[7],
            Step::Copy {
                sources: vec!["src/".into()],
                dest: "/dst/".into(),
                chown: Some("1:2".into()),
                add: false
            }
        );
        assert!(matches!(kinds[8], Step::Copy { add: true, .. }));
    }

    #[test]
    fn refuses_what_it_cannot_build() {
        let e = parse("FROM a\nHEALTHCHECK CMD true\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("HEALTHCHECK"), "{e}");
        let e = parse("FROM a AS x\nFROM b\n").unwrap_err().to_string();
        assert!(e.contains("multi-stage"), "{e}");
        assert!(parse("RUN true\n").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn expands_like_docker() {
        let vars: BTreeMap<String, String> = [("A".to_string(), "x".to_string())].into();
        assert_eq!(
            expand("$A/${A}/${B:-d}/${A:+y}/${B:+z}/\\$A/$", &vars),
            "x/x/d/y//$A/$"
        );
    }
}
