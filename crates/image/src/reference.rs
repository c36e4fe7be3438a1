//! Image names, resolved the way Docker resolves them: `python` is
//! `docker.io/library/python:latest`, `ghcr.io/org/img` gets `:latest`, `img@sha256:...` names
//! a manifest digest. Parsing is oci-spec's distribution `Reference`; this module adds the
//! short ("familiar") form Docker prints and the checks the store needs.

use oci_spec::distribution::Reference;

use crate::ImageError;

/// Parses and normalizes a reference.
pub fn parse(name: &str) -> Result<Reference, ImageError> {
    if name.is_empty() || name.len() > 4096 || name.chars().any(|c| c.is_whitespace()) {
        return Err(ImageError::InvalidName(
            name.to_owned(),
            "expected [REGISTRY/]REPOSITORY[:TAG][@DIGEST]".into(),
        ));
    }
    let r = name
        .parse::<Reference>()
        .map_err(|e| ImageError::InvalidName(name.to_owned(), e.to_string()))?;
    if r.repository().bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(ImageError::InvalidName(
            name.to_owned(),
            "repository name must be lowercase".into(),
        ));
    }
    Ok(r)
}

/// The full normalized name (`docker.io/library/busybox:latest`).
pub fn normalize(name: &str) -> Result<String, ImageError> {
    Ok(parse(name)?.whole())
}

/// The full name of a plain `[DOMAIN/]PATH[:TAG]` reference, without the regex parser: a
/// cold `exec` looks its image up by name, and compiling oci-spec's reference regex costs
/// more than the rest of the lookup (185 ms in a debug build). `None` for anything unusual
/// (digests, odd characters): use [`normalize`] then.
pub fn normalize_plain(name: &str) -> Option<String> {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/:".contains(c);
    if name.is_empty() || name.contains("//") || !name.chars().all(ok) {
        return None;
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => (first, rest),
        _ => ("docker.io", name),
    };
    // `index.docker.io` is Docker Hub's legacy name, which the parser rewrites: its answer.
    if path.is_empty() || !plain_domain(domain) || domain == "index.docker.io" {
        return None;
    }
    let last = path.rsplit('/').next().unwrap_or(path);
    let (repo, tag) = match path.split_once(':') {
        Some((repo, tag)) if !repo.contains(':') && !tag.contains(['/', ':']) => (repo, Some(tag)),
        Some(_) => return None,
        None => (path, None),
    };
    if !repo.split('/').all(plain_component) || tag.is_some_and(|t| !plain_tag(t)) {
        return None;
    }
    // The parser's limit on the repository (`library/` included).
    let library = if domain == "docker.io" && !repo.contains('/') {
        "library/".len()
    } else {
        0
    };
    if library + repo.len() > 255 {
        return None;
    }
    let mut full = String::with_capacity(name.len() + 24);
    full.push_str(domain);
    full.push('/');
    if domain == "docker.io" && !path.contains('/') {
        full.push_str("library/");
    }
    full.push_str(path);
    if !last.contains(':') {
        full.push_str(":latest");
    }
    Some(full)
}

/// A registry host as the plain normalizer takes it: dot-separated alphanumeric labels
/// (inner `-` allowed), an optional numeric port.
fn plain_domain(domain: &str) -> bool {
    let (host, port) = match domain.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (domain, None),
    };
    let label = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    host.split('.').all(label)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// A repository path component: `[a-z0-9]+` runs joined by `.`, `_`, `__` or `-`s.
fn plain_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: &u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(&b[0]) || !alnum(&b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(&b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(&b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

/// A tag: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn plain_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|x| x.is_ascii_alphanumeric() || b"_.-".contains(x))
}

/// The short form Docker prints: `docker.io/library/` and `docker.io/` dropped.
pub fn familiar(full: &str) -> String {
    full.strip_prefix("docker.io/library/")
        .or_else(|| full.strip_prefix("docker.io/"))
        .unwrap_or(full)
        .to_owned()
}

/// `repository` without registry defaults, and the tag (`<none>` when the name has only a
/// digest), as `image ls` shows them.
pub fn repo_and_tag(full: &str) -> (String, String) {
    match parse(full) {
        Ok(r) => {
            let repo = familiar(&format!("{}/{}", r.registry(), r.repository()));
            (repo, r.tag().unwrap_or("<none>").to_owned())
        }
        Err(_) => (full.to_owned(), "<none>".into()),
    }
}

/// Whether `name` could be (a prefix of) an image id: 4..64 lowercase hex digits, with or
/// without `sha256:`.
pub fn id_prefix(name: &str) -> Option<&str> {
    let hex = name.strip_prefix("sha256:").unwrap_or(name);
    (hex.len() >= 4
        && hex.len() <= 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_docker() {
        assert_eq!(
            normalize("python").unwrap(),
            "docker.io/library/python:latest"
        );
        assert_eq!(
            normalize("python:3.12-slim").unwrap(),
            "docker.io/library/python:3.12-slim"
        );
        assert_eq!(normalize("org/tool").unwrap(), "docker.io/org/tool:latest");
        assert_eq!(
            normalize("localhost:5000/busybox").unwrap(),
            "localhost:5000/busybox:latest"
        );
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            normalize(&format!("busybox@{d}")).unwrap(),
            format!("docker.io/library/busybox@{d}")
        );
        assert!(normalize("UPPER/case").is_err());
        assert!(normalize("a b").is_err());
        assert!(normalize("").is_err());
    }

    #[test]
    fn the_plain_normalizer_agrees_with_the_parser() {
        for n in [
            "python",
            "python:3.12-slim",
            "org/tool",
            "org/sub/tool:1",
            "localhost/x",
            "localhost:5000/busybox",
            "127.0.0.1:5000/agentrun/busybox:1.0",
            "ghcr.io/org/img",
            "docker.io/library/busybox:latest",
            "library/busybox",
        ] {
            assert_eq!(normalize_plain(n), Some(normalize(n).unwrap()), "{n}");
        }
        // Found by the image_reference fuzz target: the plain normalizer took names the
        // parser refuses (an empty tag, separators at the ends, ...).
        for odd in [
            "",
            "a b",
            "UPPER",
            "x@sha256:abc",
            "a//b",
            "x:",
            "x:-",
            "-x",
            "x.",
            "a/b:c/d",
            "local-:5000/x",
            "a:b:c",
            "a...b",
            // Docker Hub's legacy name, rewritten by the parser (a fuzz finding).
            "index.docker.io/b",
        ] {
            assert_eq!(normalize_plain(odd), None, "{odd}");
        }
        assert_eq!(
            normalize("index.docker.io/b").unwrap(),
            "docker.io/library/b:latest"
        );
        // Repository names over 255 characters (the fuzz target's second finding).
        let long = format!("org/{}", "a".repeat(251));
        assert_eq!(normalize_plain(&long), Some(normalize(&long).unwrap()));
        for odd in [
            format!("org/{}", "a".repeat(252)),
            "a".repeat(248),
            format!("ghcr.io/{}/x:1", "b".repeat(254)),
        ] {
            assert!(normalize(&odd).is_err(), "{odd}");
            assert_eq!(normalize_plain(&odd), None, "{odd}");
        }
    }

    #[test]
    fn familiar_names() {
        assert_eq!(
            familiar("docker.io/library/busybox:latest"),
            "busybox:latest"
        );
        assert_eq!(familiar("docker.io/org/x:1"), "org/x:1");
        assert_eq!(familiar("127.0.0.1:5000/x:1"), "127.0.0.1:5000/x:1");
        assert_eq!(
            repo_and_tag("docker.io/library/busybox:1.36"),
            ("busybox".into(), "1.36".into())
        );
    }

    #[test]
    fn id_prefixes() {
        assert_eq!(id_prefix("abcd12"), Some("abcd12"));
        assert_eq!(id_prefix("sha256:abcd"), Some("abcd"));
        assert_eq!(id_prefix("abc"), None);
        assert_eq!(id_prefix("busybox"), None);
    }
}
