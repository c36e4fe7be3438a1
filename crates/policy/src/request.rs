//! One HTTP request as the policy sees it: what L7 rules ([`crate::http`]), a profile's
//! network policy ([`crate::network`]) and its decisions ([`crate::decision`]) are asked about.

/// One HTTP request as L7 rules see it.
#[derive(Debug, Clone, Copy)]
pub struct HttpRequest<'a> {
    pub method: &'a str,
    pub host: &'a str,
    pub port: u16,
    /// The path as sent (with its query, if any).
    pub path: &'a str,
    /// The head's fields: names, and values as sent.
    pub fields: &'a [(String, Vec<u8>)],
}
