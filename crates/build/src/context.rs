//! The build context and COPY/ADD layers.
//!
//! Sources are resolved inside the context directory (a source that leaves it, by `..` or a
//! symlink, is refused). The layer written for a COPY carries the destination's parent
//! directories with the metadata they already have in the image (so `COPY x /tmp/` keeps
//! /tmp's 1777), files owned by 0:0 or `--chown=UID[:GID]`.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use crate::BuildError;

/// A source of COPY/ADD, resolved inside the context.
fn resolve_source(context: &Path, src: &str) -> Result<PathBuf, BuildError> {
    if src.contains(['*', '?', '[']) {
        return Err(BuildError::Context(format!(
            "{src}: wildcards in COPY/ADD sources are not supported"
        )));
    }
    if src.contains("://") {
        return Err(BuildError::Context(format!(
            "{src}: remote URLs in ADD are not supported (builds have no network)"
        )));
    }
    let mut rel = PathBuf::new();
    for c in Path::new(src).components() {
        match c {
            Component::Normal(s) => rel.push(s),
            Component::CurDir | Component::RootDir => {}
            _ => {
                return Err(BuildError::Context(format!(
                    "{src}: outside the build context"
                )))
            }
        }
    }
    let full = context.join(&rel);
    let real = full
        .canonicalize()
        .map_err(|e| BuildError::Context(format!("{src}: {e}")))?;
    if !real.starts_with(context) {
        return Err(BuildError::Context(format!(
            "{src}: outside the build context"
        )));
    }
    Ok(real)
}

/// Owner of copied files: `--chown=UID[:GID]` (numeric only), default 0:0.
pub fn parse_chown(chown: Option<&str>) -> Result<(u64, u64), BuildError> {
    let Some(c) = chown else { return Ok((0, 0)) };
    let (u, g) = c.split_once(':').unwrap_or((c, c));
    match (u.parse::<u64>(), g.parse::<u64>()) {
        (Ok(u), Ok(g)) => Ok((u, g)),
        _ => Err(BuildError::Context(format!(
            "--chown={c}: only numeric UID[:GID] is supported"
        ))),
    }
}

/// Looks up `path` (absolute, in image terms) through layer directories, topmost first,
/// following overlayfs rules: a whiteout hides it, an opaque directory hides lower layers.
pub fn lookup(layers_top_first: &[PathBuf], path: &Path) -> Option<fs::Metadata> {
    let rel: PathBuf = path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    if rel.as_os_str().is_empty() {
        return layers_top_first
            .first()
            .and_then(|l| fs::symlink_metadata(l).ok());
    }
    for layer in layers_top_first {
        let mut cur = layer.clone();
        let comps: Vec<_> = rel.components().collect();
        for (i, c) in comps.iter().enumerate() {
            cur.push(c);
            let Ok(m) = fs::symlink_metadata(&cur) else {
                break;
            };
            if m.file_type().is_char_device() && m.rdev() == 0 {
                return None;
            }
            if i + 1 == comps.len() {
                return Some(m);
            }
            if !m.is_dir() {
                break;
            }
            if xattr_opaque(&cur) && i + 1 < comps.len() {
                // Deeper entries only from this layer: look no further down.
                let rest: PathBuf = comps[i + 1..].iter().collect();
                return fs::symlink_metadata(cur.join(rest)).ok();
            }
        }
    }
    None
}

fn xattr_opaque(p: &Path) -> bool {
    matches!(xattr::get(p, "trusted.overlay.opaque"), Ok(Some(v)) if v == b"y")
}

/// Writes the layer of one COPY/ADD.
pub struct CopyLayer<'a> {
    pub context: &'a Path,
    /// The image's layers so far, topmost first (for parents' metadata).
    pub layers: &'a [PathBuf],
    pub owner: (u64, u64),
    /// ADD: unpack local tar archives at the destination.
    pub unpack_archives: bool,
    /// What unpacking such an archive may cost (the store's limits).
    pub limits: agentrun_image::UnpackLimits,
}

impl CopyLayer<'_> {
    /// `dest` is absolute (already joined with WORKDIR).
    pub fn write(
        &self,
        sources: &[String],
        dest: &str,
        out: &mut dyn Write,
    ) -> Result<(), BuildError> {
        let io_err = |e: io::Error| BuildError::Context(e.to_string());
        let mut b = tar::Builder::new(out);
        b.follow_symlinks(false);
        let resolved: Vec<PathBuf> = sources
            .iter()
            .map(|s| resolve_source(self.context, s))
            .collect::<Result<_, _>>()?;
        let dest_is_dir = dest.ends_with('/') || resolved.len() > 1;
        let dest_path = PathBuf::from(dest);
        // Parents of what we write, with the metadata the image has for them.
        let top = if dest_is_dir {
            dest_path.clone()
        } else {
            dest_path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
        };
        let mut acc = PathBuf::from("/");
        for c in top
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
        {
            acc.push(c);
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            match lookup(self.layers, &acc) {
                Some(m) if m.is_dir() => {
                    h.set_mode(m.mode() & 0o7777);
                    h.set_uid(u64::from(m.uid()));
                    h.set_gid(u64::from(m.gid()));
                    h.set_mtime(m.mtime().max(0) as u64);
                }
                _ => {
                    h.set_mode(0o755);
                    h.set_uid(0);
                    h.set_gid(0);
                    h.set_mtime(now_secs());
                }
            }
            h.set_size(0);
            b.append_data(&mut h, rel(&acc), io::empty())
                .map_err(io_err)?;
        }
        for (src, name) in resolved.iter().zip(sources) {
            let meta =
                fs::metadata(src).map_err(|e| BuildError::Context(format!("{name}: {e}")))?;
            if meta.is_dir() {
                self.append_tree(&mut b, src, &rel(&dest_path))
                    .map_err(io_err)?;
            } else if self.unpack_archives && is_archive(src) {
                self.append_archive(&mut b, src, &rel(&dest_path))?;
            } else {
                let target = if dest_is_dir {
                    dest_path.join(src.file_name().unwrap_or_default())
                } else {
                    dest_path.clone()
                };
                let mut h = self.header(&meta, tar::EntryType::Regular);
                h.set_size(meta.len());
                let f = File::open(src).map_err(io_err)?;
                b.append_data(&mut h, rel(&target), f).map_err(io_err)?;
            }
        }
        b.finish().map_err(io_err)
    }

    fn header(&self, m: &fs::Metadata, kind: tar::EntryType) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(m.mode() & 0o7777);
        h.set_uid(self.owner.0);
        h.set_gid(self.owner.1);
        h.set_mtime(m.mtime().max(0) as u64);
        h.set_size(0);
        h
    }

    fn append_tree(
        &self,
        b: &mut tar::Builder<&mut dyn Write>,
        dir: &Path,
        at: &Path,
    ) -> io::Result<()> {
        for entry in agentrun_image::sorted_entries(dir, at)? {
            let (path, name, m) = entry?;
            let ft = m.file_type();
            if ft.is_dir() {
                let mut h = self.header(&m, tar::EntryType::Directory);
                b.append_data(&mut h, &name, io::empty())?;
                self.append_tree(b, &path, &name)?;
            } else if ft.is_symlink() {
                let mut h = self.header(&m, tar::EntryType::Symlink);
                b.append_link(&mut h, &name, fs::read_link(&path)?)?;
            } else if ft.is_file() {
                let mut h = self.header(&m, tar::EntryType::Regular);
                h.set_size(m.len());
                b.append_data(&mut h, &name, File::open(&path)?)?;
            }
        }
        Ok(())
    }

    /// ADD of a local archive: its entries, re-rooted at `at` (the layer unpacker applies the
    /// usual path rules to them). The archive is read under the store's unpack limits, so a
    /// decompression bomb in the context is refused by its expansion ratio.
    fn append_archive(
        &self,
        b: &mut tar::Builder<&mut dyn Write>,
        src: &Path,
        at: &Path,
    ) -> Result<(), BuildError> {
        let bad = |e: io::Error| BuildError::Context(format!("{}: {e}", src.display()));
        let f = File::open(src).map_err(bad)?;
        agentrun_image::for_each_tar_entry(f, self.limits, src, |entry| {
            let mut h = entry.header().clone();
            let path = entry.path()?.into_owned();
            if path.components().any(|c| matches!(c, Component::ParentDir)) {
                return Err(io::Error::other(format!(
                    "entry {} leaves the destination",
                    path.display()
                )));
            }
            let rel_path: PathBuf = path
                .components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .collect();
            let name = at.join(rel_path);
            match h.entry_type() {
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    let link = entry.link_name()?.unwrap_or_default().into_owned();
                    let link = if h.entry_type() == tar::EntryType::Link {
                        at.join(
                            link.components()
                                .filter(|c| matches!(c, Component::Normal(_)))
                                .collect::<PathBuf>(),
                        )
                    } else {
                        link
                    };
                    b.append_link(&mut h, &name, link)
                }
                _ => b.append_data(&mut h, &name, entry),
            }
        })
        .map_err(|e| BuildError::Context(e.to_string()))
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Path without its leading `/`, as layer tars write them.
fn rel(p: &Path) -> PathBuf {
    p.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect()
}

fn magic(p: &Path) -> [u8; 262] {
    let mut buf = [0u8; 262];
    if let Ok(mut f) = File::open(p) {
        // A short or failed read leaves zeros: no known archive magic.
        let _ = f.read(&mut buf);
    }
    buf
}

fn is_archive(p: &Path) -> bool {
    let m = magic(p);
    m.starts_with(&[0x1f, 0x8b]) || &m[257..262] == b"ustar"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_stay_inside_the_context() {
        let d = std::env::temp_dir().join(format!("agentrun-ctx-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("sub")).unwrap();
        fs::write(d.join("sub/a"), "a").unwrap();
        std::os::unix::fs::symlink("/etc", d.join("etc-link")).unwrap();
        let ctx = d.canonicalize().unwrap();
        assert!(resolve_source(&ctx, "sub/a").is_ok());
        assert!(resolve_source(&ctx, "/sub/a").is_ok());
        assert!(resolve_source(&ctx, "../x").is_err());
        assert!(resolve_source(&ctx, "etc-link/passwd").is_err());
        assert!(resolve_source(&ctx, "*.py").is_err());
        assert!(resolve_source(&ctx, "http://x/y").is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn chown_is_numeric() {
        assert_eq!(parse_chown(None).unwrap(), (0, 0));
        assert_eq!(parse_chown(Some("1000")).unwrap(), (1000, 1000));
        assert_eq!(parse_chown(Some("1:2")).unwrap(), (1, 2));
        assert!(parse_chown(Some("app:app")).is_err());
    }
}
