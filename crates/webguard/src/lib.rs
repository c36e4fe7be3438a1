//! Who may reach agentrun's HTTP listeners (`serve --listen`, `--mcp`, `--metrics`): one
//! implementation shared by all three.
//!
//! - [`keyfile`]: the API key generated on first start into a 0600 file of the daemon's
//!   state dir (Jupyter's token model), read back on later starts and by `agentrun api-key`.
//! - [`origin`]: the `Host` allowlist (loopback names, the listen address, configured names:
//!   what stops DNS rebinding) and the `Origin` check of state-changing requests (what
//!   stops a web page's cross-site requests), as an axum middleware ([`guard`]), plus
//!   [`is_json`], the one `Content-Type` a JSON body is read with.

pub mod keyfile;
pub mod origin;

pub use keyfile::{KeyFile, KeyFileError};
pub use origin::{guard, is_json, HostGuard, HostGuardError};
