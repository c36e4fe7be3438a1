//! The Dockerfile parser (`crates/build/src/dockerfile.rs`, over the `dockerfile-parser`
//! crate): a Dockerfile from a build context (`docker build`, `agentrun image build`) into
//! steps, every value that takes variables expanded as the builder does, `--chown` parsed.
#![no_main]

use std::collections::BTreeMap;

use agentrun_build::dockerfile::{self, CommandForm, Step};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut vars = BTreeMap::new();
    vars.insert("HOME".to_owned(), "/root".to_owned());
    vars.insert("EMPTY".to_owned(), String::new());
    let Ok(steps) = dockerfile::parse(text) else {
        // The expander alone, on the whole text.
        let _ = dockerfile::expand(text, &vars);
        return;
    };
    for s in steps {
        match s.step {
            Step::From { image } => {
                let _ = dockerfile::expand(&image, &vars);
            }
            Step::Run(c) | Step::Cmd(c) | Step::Entrypoint(c) => {
                let _ = c.argv();
                if let CommandForm::Shell(s) = c {
                    let _ = dockerfile::expand(&s, &vars);
                }
            }
            Step::Workdir(w) | Step::User(w) | Step::StopSignal(w) => {
                let _ = dockerfile::expand(&w, &vars);
            }
            Step::Env(kv) | Step::Label(kv) => {
                for (k, v) in kv {
                    let v = dockerfile::expand(&v, &vars);
                    vars.insert(k, v);
                }
            }
            Step::Arg { name, default } => {
                vars.insert(name, default.unwrap_or_default());
            }
            Step::Expose(ports) => {
                for p in ports {
                    let _ = dockerfile::expand(&p, &vars);
                }
            }
            Step::Copy {
                sources,
                dest,
                chown,
                ..
            } => {
                for src in sources {
                    let _ = dockerfile::expand(&src, &vars);
                }
                let _ = dockerfile::expand(&dest, &vars);
                let chown = chown.map(|c| dockerfile::expand(&c, &vars));
                let _ = agentrun_build::context::parse_chown(chown.as_deref());
            }
        }
    }
});
