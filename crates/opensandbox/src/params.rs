//! What a request says besides its body, read the same way by every API of the crate: a
//! segment of its path, its query's pairs and flags, its `traceparent` header.

use std::collections::HashMap;

use axum::http::HeaderMap;

use crate::error::{ApiError, ApiResult};

/// The `{name}` segment of a request's path ("" when the route has none).
pub fn segment<'a>(path: &'a HashMap<String, String>, name: &str) -> &'a str {
    path.get(name).map(String::as_str).unwrap_or("")
}

/// A raw query's `key=value` pairs, percent-decoded, in order.
pub fn query_pairs(q: &Option<String>) -> Vec<(String, String)> {
    q.as_deref()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// A true-or-false query parameter (any of `names`; the last one given counts): `true`/`1`,
/// `false`/`0`/empty, any case; absent: false. Anything else is a 400 naming `names[0]`.
pub fn query_flag(q: &Option<String>, names: &[&str]) -> ApiResult<bool> {
    let mut flag = false;
    for (k, v) in query_pairs(q) {
        if names.contains(&k.as_str()) {
            flag = match v.to_ascii_lowercase().as_str() {
                "true" | "1" => true,
                "false" | "0" | "" => false,
                _ => {
                    let name = names[0];
                    return Err(ApiError::bad_request(format!(
                        "{name} must be true or false"
                    )));
                }
            };
        }
    }
    Ok(flag)
}

/// The caller's `traceparent` header, which the request's span continues.
pub fn traceparent(headers: &HeaderMap) -> Option<String> {
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}
