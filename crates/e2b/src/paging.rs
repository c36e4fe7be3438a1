//! Pages of a list (sandboxes, snapshots): the `limit` and `nextToken` query parameters.

use crate::error::{E2bError, E2bResult};

/// A page's length when the request names none (sandboxes, snapshots).
pub(crate) const DEFAULT_LIMIT: usize = 100;
/// The largest page.
const MAX_LIMIT: usize = 1000;

/// A page's `limit`: 1 to [`MAX_LIMIT`], else 400.
pub(crate) fn page_limit(v: &str) -> E2bResult<usize> {
    v.parse()
        .ok()
        .filter(|l| (1..=MAX_LIMIT).contains(l))
        .ok_or_else(|| E2bError::bad_request(format!("limit must be between 1 and {MAX_LIMIT}")))
}

/// A `nextToken` this server handed out (where the next page starts), else 400.
pub(crate) fn page_start(v: &str) -> E2bResult<usize> {
    v.parse()
        .map_err(|_| E2bError::bad_request("nextToken: not a token of this server"))
}
