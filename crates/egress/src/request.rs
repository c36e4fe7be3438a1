//! What a sandbox sends the proxy: one HTTP/1 request head, parsed with `httparse` and held
//! to the rules a forwarding proxy needs so that it and the upstream never read a request two
//! ways (request smuggling), and its body, re-framed.
//!
//! [`parse_request_head`] is a pure function (the fuzz target `egress_request` drives it).
//! It refuses, with the status a proxy answers:
//! - a head over [`MAX_HEAD`] or with more than [`MAX_HEADERS`] fields (431);
//! - anything `httparse` refuses: a malformed request line, a version other than HTTP/1.0
//!   or 1.1, bad bytes in names or values, obs-fold (a field continued on the next line);
//! - a bare LF or a bare CR anywhere in the head;
//! - `Content-Length` twice (even with the same value), as a list, or not a plain number;
//! - `Transfer-Encoding` twice, with `Content-Length`, in HTTP/1.0, or other than `chunked`
//!   (501);
//! - `Host` twice, or (absolute form) naming another host or port than the request target;
//! - a CONNECT target that is not `host:port`, or a CONNECT with a body;
//! - any other target than an absolute `http://` URL (CONNECT is for the rest), with
//!   user info or a fragment, or with a host that is not a name or an address.
//!
//! A forwarded request goes upstream re-serialized in origin form: `Host` from the target,
//! hop-by-hop fields (`Connection` and what it names, `Keep-Alive`, `Proxy-*`, `TE`,
//! `Trailer`, `Upgrade`) dropped, the framing written by the proxy (`Content-Length`, or a
//! chunked body re-encoded by [`relay_body`]), and `Connection: close`: one request per
//! connection, so nothing the client sends after the body reaches the upstream.

use std::io::{self, BufRead, Read, Write};
use std::net::Ipv6Addr;

/// Largest request head accepted.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in a request head.
pub const MAX_HEADERS: usize = 64;
/// Longest chunk-size or trailer line of a chunked body.
const MAX_CHUNK_LINE: u64 = 4096;

/// How the body that follows a head is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A request head the proxy accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// `CONNECT host:port` (a tunnel); otherwise an absolute-form HTTP request.
    pub connect: bool,
    /// Lower-case host name, or an IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// For a forwarded request: the head to send upstream.
    pub forward: Vec<u8>,
    /// What follows the head.
    pub body: Body,
    /// For a forwarded request: the request in origin form, to change (credential
    /// injection) and write again with [`OriginHead::forward`].
    pub origin: Option<OriginHead>,
}

/// Why a head is refused: the status to answer and a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadError {
    pub status: u16,
    pub message: String,
}

impl HeadError {
    fn bad(message: impl Into<String>) -> Self {
        HeadError {
            status: 400,
            message: message.into(),
        }
    }

    /// The status line's reason phrase.
    pub fn reason(&self) -> &'static str {
        match self.status {
            421 => "Misdirected Request",
            431 => "Request Header Fields Too Large",
            501 => "Not Implemented",
            _ => "Bad Request",
        }
    }
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A request head's parts every form shares, checked (see the module docs).
struct Parsed<'b> {
    method: &'b str,
    target: &'b str,
    minor: u8,
    /// The end-to-end fields (hop-by-hop, framing and `Host` dropped), as sent.
    fields: Vec<(String, Vec<u8>)>,
    host_field: Option<Vec<u8>>,
    length: Option<u64>,
    body: Body,
    len: usize,
    /// The client asked to close after this request (`Connection: close`, or HTTP/1.0
    /// without `keep-alive`).
    close: bool,
}

fn parse_common(buf: &[u8]) -> Result<Option<Parsed<'_>>, HeadError> {
    let too_large = || HeadError {
        status: 431,
        message: format!("request head over {} KiB", MAX_HEAD / 1024),
    };
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(too_large()),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError {
                status: 431,
                message: format!("more than {MAX_HEADERS} header fields"),
            })
        }
        Err(e) => return Err(HeadError::bad(format!("malformed request head: {e}"))),
    };
    if len > MAX_HEAD {
        return Err(too_large());
    }
    let raw = &buf[..len];
    for (i, b) in raw.iter().enumerate() {
        let lf_alone = *b == b'\n' && (i == 0 || raw[i - 1] != b'\r');
        let cr_alone = *b == b'\r' && raw.get(i + 1) != Some(&b'\n');
        if lf_alone || cr_alone {
            return Err(HeadError::bad(
                "a line of the request head does not end in CRLF",
            ));
        }
    }
    let method = req.method.expect("complete");
    let target = req.path.expect("complete");
    let minor = req.version.expect("complete");

    let mut host_field: Option<&[u8]> = None;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut hop_by_hop: Vec<String> = Vec::new();
    for f in req.headers.iter() {
        let name = f.name.to_ascii_lowercase();
        match name.as_str() {
            "host" if host_field.is_some() => return Err(HeadError::bad("two Host fields")),
            "host" => host_field = Some(f.value),
            "content-length" => {
                if length.is_some() {
                    return Err(HeadError::bad("two Content-Length fields"));
                }
                length = Some(content_length(f.value)?);
            }
            "transfer-encoding" => {
                if chunked {
                    return Err(HeadError::bad("two Transfer-Encoding fields"));
                }
                if !trim(f.value).eq_ignore_ascii_case(b"chunked") {
                    return Err(HeadError {
                        status: 501,
                        message: format!(
                            "Transfer-Encoding {:?}: only chunked is supported",
                            String::from_utf8_lossy(f.value)
                        ),
                    });
                }
                chunked = true;
            }
            "connection" => hop_by_hop.extend(
                String::from_utf8_lossy(f.value)
                    .split(',')
                    .map(|t| t.trim().to_ascii_lowercase())
                    .filter(|t| !t.is_empty()),
            ),
            _ => {}
        }
    }
    if chunked && length.is_some() {
        return Err(HeadError::bad(
            "both Transfer-Encoding and Content-Length (refused: they could be read two ways)",
        ));
    }
    if chunked && minor == 0 {
        return Err(HeadError::bad("Transfer-Encoding in an HTTP/1.0 request"));
    }
    let body = match (chunked, length) {
        (true, _) => Body::Chunked,
        (false, Some(n)) if n > 0 => Body::Length(n),
        _ => Body::None,
    };
    let kept = req
        .headers
        .iter()
        .filter(|f| {
            let name = f.name.to_ascii_lowercase();
            !(matches!(
                name.as_str(),
                "host"
                    | "content-length"
                    | "transfer-encoding"
                    | "connection"
                    | "keep-alive"
                    | "proxy-connection"
                    | "proxy-authorization"
                    | "proxy-authenticate"
                    | "te"
                    | "trailer"
                    | "upgrade"
            ) || hop_by_hop.contains(&name))
        })
        .map(|f| (f.name.to_owned(), trim(f.value).to_vec()))
        .collect();
    let close = hop_by_hop.iter().any(|t| t == "close")
        || (minor == 0 && !hop_by_hop.iter().any(|t| t == "keep-alive"));
    Ok(Some(Parsed {
        method,
        target,
        minor,
        fields: kept,
        host_field: host_field.map(<[u8]>::to_vec),
        length,
        body,
        len,
        close,
    }))
}

/// Writes a head in origin form for the upstream: `Host: authority`, the end-to-end
/// `fields`, the framing the proxy writes, and `Connection: close`.
#[allow(clippy::too_many_arguments)]
fn serialize(
    method: &str,
    path: &str,
    minor: u8,
    authority: &str,
    fields: &[(String, Vec<u8>)],
    body: Body,
    length: Option<u64>,
    close: bool,
) -> Vec<u8> {
    let mut fwd = Vec::with_capacity(256);
    write!(
        fwd,
        "{method} {path} HTTP/1.{minor}\r\nHost: {authority}\r\n"
    )
    .expect("vec");
    for (name, value) in fields {
        fwd.extend_from_slice(name.as_bytes());
        fwd.extend_from_slice(b": ");
        fwd.extend_from_slice(value);
        fwd.extend_from_slice(b"\r\n");
    }
    match body {
        Body::Length(n) => write!(fwd, "Content-Length: {n}\r\n").expect("vec"),
        Body::Chunked => fwd.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        Body::None if length == Some(0) => fwd.extend_from_slice(b"Content-Length: 0\r\n"),
        Body::None => {}
    }
    if close {
        fwd.extend_from_slice(b"Connection: close\r\n");
    }
    fwd.extend_from_slice(b"\r\n");
    fwd
}

/// Parses the request head at the start of `buf`. `Ok(None)`: incomplete, read more (a
/// caller holding [`MAX_HEAD`] bytes gets an error instead). `Ok(Some((head, len)))`: the
/// head, and how many bytes of `buf` it took (the rest is the body, or tunnel data).
pub fn parse_request_head(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let Some(p) = parse_common(buf)? else {
        return Ok(None);
    };
    let (method, target, len, body) = (p.method, p.target, p.len, p.body);
    if method.eq_ignore_ascii_case("CONNECT") {
        if body != Body::None {
            return Err(HeadError::bad("a CONNECT request with a body"));
        }
        let (host, port) = authority(target, None)?;
        return Ok(Some((
            RequestHead {
                connect: true,
                host,
                port,
                forward: Vec::new(),
                body,
                origin: None,
            },
            len,
        )));
    }

    let scheme_len = "http://".len();
    let rest = match target.get(..scheme_len) {
        Some(s) if s.eq_ignore_ascii_case("http://") => &target[scheme_len..],
        _ => {
            return Err(HeadError::bad(format!(
                "{target:?}: the proxy forwards http:// URLs; use CONNECT for anything else"
            )))
        }
    };
    if rest.contains('#') {
        return Err(HeadError::bad(format!(
            "{target:?}: a fragment in a request target"
        )));
    }
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(split);
    let (host, port) = authority(auth, Some(80))?;
    if let Some(h) = &p.host_field {
        let named = std::str::from_utf8(trim(h))
            .map_err(|_| HeadError::bad("Host is not ASCII"))
            .and_then(|h| authority(h, Some(80)))?;
        if named != (host.clone(), port) {
            return Err(HeadError::bad(format!(
                "Host {:?} is not the request target's host {}",
                String::from_utf8_lossy(h),
                auth.to_ascii_lowercase()
            )));
        }
    }
    let path = match path {
        "" => "/".to_owned(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_owned(),
    };
    let fwd = serialize(
        method,
        &path,
        p.minor,
        &auth.to_ascii_lowercase(),
        &p.fields,
        body,
        p.length,
        true,
    );
    let origin = OriginHead {
        method: method.to_owned(),
        path,
        minor: p.minor,
        fields: p.fields,
        body,
        length: p.length,
        close: true,
    };
    Ok(Some((
        RequestHead {
            connect: false,
            host,
            port,
            forward: fwd,
            body,
            origin: Some(origin),
        },
        len,
    )))
}

/// A request read inside an intercepted TLS connection (origin form: `GET /path`), its
/// `Host` checked against the host the tunnel was opened to. Its fields may be changed
/// (credential injection) before [`OriginHead::forward`] writes it for the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginHead {
    pub method: String,
    /// Path and query, starting with `/`.
    pub path: String,
    minor: u8,
    /// End-to-end fields (hop-by-hop, framing and `Host` dropped).
    pub fields: Vec<(String, Vec<u8>)>,
    pub body: Body,
    length: Option<u64>,
    /// The client asked to close the connection after this request.
    pub close: bool,
}

impl Drop for OriginHead {
    /// A head may hold an injected credential: its fields and path are zeroized.
    fn drop(&mut self) {
        for (_, v) in &mut self.fields {
            zeroize::Zeroize::zeroize(v);
        }
        zeroize::Zeroize::zeroize(&mut self.path);
    }
}

impl OriginHead {
    /// The head to send upstream to `host:port` (`Host` written by the proxy, port omitted
    /// when it is `default_port`).
    pub fn forward(&self, host: &str, port: u16, default_port: u16) -> Vec<u8> {
        self.forward_with(host, port, default_port, true)
    }

    /// [`OriginHead::forward`], asking the upstream to close after it (`close`) or not.
    pub fn forward_with(&self, host: &str, port: u16, default_port: u16, close: bool) -> Vec<u8> {
        let h = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let authority = if port == default_port {
            h
        } else {
            format!("{h}:{port}")
        };
        serialize(
            &self.method,
            &self.path,
            self.minor,
            &authority,
            &self.fields,
            self.body,
            self.length,
            close,
        )
    }

    /// The value of the first field named `name` (case-insensitive).
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// Removes every field named `name`; whether there was one.
    pub fn remove_field(&mut self, name: &str) -> bool {
        let before = self.fields.len();
        self.fields.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.fields.len() != before
    }

    /// Sets field `name` to `value`, replacing every field of that name the client sent.
    pub fn set_field(&mut self, name: &str, value: Vec<u8>) {
        self.fields.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.fields.push((name.to_owned(), value));
    }
}

/// Parses an origin-form request head (`GET /path HTTP/1.1`) at the start of `buf`, read
/// inside a tunnel to `host:port` (`default_port`: the scheme's). Refuses what
/// [`parse_request_head`] refuses, any target other than an origin-form path, CONNECT, a
/// missing `Host`, and a `Host` naming another host or port than the tunnel's (421: domain
/// fronting).
pub fn parse_origin_head(
    buf: &[u8],
    host: &str,
    port: u16,
    default_port: u16,
) -> Result<Option<(OriginHead, usize)>, HeadError> {
    let Some(p) = parse_common(buf)? else {
        return Ok(None);
    };
    if !p.target.starts_with('/') || p.target.contains('#') {
        return Err(HeadError::bad(format!(
            "{:?}: inside a tunnel a request target is a path",
            p.target
        )));
    }
    if p.method.eq_ignore_ascii_case("CONNECT") {
        return Err(HeadError::bad("CONNECT inside a tunnel"));
    }
    let Some(h) = &p.host_field else {
        return Err(HeadError::bad("no Host field"));
    };
    let named = std::str::from_utf8(trim(h))
        .map_err(|_| HeadError::bad("Host is not ASCII"))
        .and_then(|h| authority(h, Some(default_port)))?;
    if named != (host.to_owned(), port) {
        return Err(HeadError {
            status: 421,
            message: format!(
                "Host {:?} is not {host}:{port}, the host this connection was opened to",
                String::from_utf8_lossy(h)
            ),
        });
    }
    Ok(Some((
        OriginHead {
            method: p.method.to_owned(),
            path: p.target.to_owned(),
            minor: p.minor,
            fields: p.fields,
            body: p.body,
            length: p.length,
            close: p.close,
        },
        p.len,
    )))
}

/// How a response's body is framed (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    /// None: a response to HEAD, 1xx, 204, 304.
    None,
    Length(u64),
    Chunked,
    /// Until the upstream closes.
    UntilClose,
}

/// A response head an intercepting proxy reads from the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    pub code: u16,
    /// Bytes of the head.
    pub len: usize,
    pub body: ResponseBody,
    /// The upstream closes after it (`Connection: close`, or HTTP/1.0 without keep-alive).
    pub close: bool,
}

/// Parses the response head at the start of `buf` (`head_request`: the request was HEAD).
/// `Ok(None)`: read more. Refuses both `Content-Length` and `Transfer-Encoding`, and two
/// different lengths.
pub fn parse_response_head(
    buf: &[u8],
    head_request: bool,
) -> Result<Option<ResponseHead>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut fields);
    let len = match res.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(HeadError::bad("response head too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(HeadError::bad(format!("malformed response head: {e}"))),
    };
    let code = res.code.expect("complete");
    let minor = res.version.expect("complete");
    let (mut length, mut te, mut tokens) = (None::<u64>, None::<bool>, Vec::new());
    for f in res.headers.iter() {
        let name = f.name.to_ascii_lowercase();
        match name.as_str() {
            "content-length" => {
                let n = content_length(f.value)?;
                if length.is_some_and(|l| l != n) {
                    return Err(HeadError::bad("two different Content-Length fields"));
                }
                length = Some(n);
            }
            "transfer-encoding" => {
                let last = String::from_utf8_lossy(f.value)
                    .rsplit(',')
                    .next()
                    .map(|t| t.trim().eq_ignore_ascii_case("chunked"))
                    .unwrap_or(false);
                te = Some(last);
            }
            "connection" => tokens.extend(
                String::from_utf8_lossy(f.value)
                    .split(',')
                    .map(|t| t.trim().to_ascii_lowercase()),
            ),
            _ => {}
        }
    }
    if te.is_some() && length.is_some() {
        return Err(HeadError::bad(
            "a response with both Transfer-Encoding and Content-Length",
        ));
    }
    let close = tokens.iter().any(|t| t == "close")
        || (minor == 0 && !tokens.iter().any(|t| t == "keep-alive"));
    let body = if head_request || code < 200 || code == 204 || code == 304 {
        ResponseBody::None
    } else {
        match (te, length) {
            (Some(true), _) => ResponseBody::Chunked,
            (Some(false), _) => ResponseBody::UntilClose,
            (None, Some(n)) => ResponseBody::Length(n),
            (None, None) => ResponseBody::UntilClose,
        }
    };
    Ok(Some(ResponseHead {
        code,
        len,
        body,
        close,
    }))
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |i| i + 1);
    &v[start..end]
}

/// A `Content-Length` value: digits only (no sign, list or spaces inside).
fn content_length(v: &[u8]) -> Result<u64, HeadError> {
    let v = trim(v);
    let bad = || {
        HeadError::bad(format!(
            "Content-Length {:?} is not a number",
            String::from_utf8_lossy(v)
        ))
    };
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)
}

/// `host:port`, `[v6]:port`, or (with a default port) `host` / `[v6]`: the host lower-cased,
/// a name or an address, no user info.
fn authority(a: &str, default_port: Option<u16>) -> Result<(String, u16), HeadError> {
    let bad = |why: &str| HeadError::bad(format!("{a:?}: {why}"));
    if a.contains('@') {
        return Err(bad("user info in a request target is not accepted"));
    }
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
        if h.parse::<Ipv6Addr>().is_err() {
            return Err(bad("not an IPv6 address in brackets"));
        }
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or_else(|| bad("bad port"))?)),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        }
    };
    let port = match port {
        Some(p) => Some(p)
            .filter(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|p| *p != 0)
            .ok_or_else(|| bad("bad port"))?,
        None => default_port.ok_or_else(|| bad("CONNECT needs host:port"))?,
    };
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !name_ok && host.parse::<Ipv6Addr>().is_err() {
        return Err(bad("not a host name or an address"));
    }
    Ok((host.to_ascii_lowercase(), port))
}

/// A response head at the start of `buf`, rewritten to end the connection: `Connection`
/// and `Keep-Alive` dropped, `Connection: close` added. `Ok(Some((head, len)))`: the new
/// head (empty for a 1xx response, which is passed on as it is) and the old head's length;
/// `Ok(None)`: read more.
pub fn close_response_head(buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut fields);
    let len = match res.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(HeadError::bad(format!("malformed response head: {e}"))),
    };
    let code = res.code.expect("complete");
    if (100..200).contains(&code) {
        return Ok(Some((Vec::new(), len)));
    }
    let mut out = Vec::with_capacity(len + 32);
    write!(
        out,
        "HTTP/1.{} {code} {}\r\n",
        res.version.expect("complete"),
        res.reason.unwrap_or_default()
    )
    .expect("vec");
    for f in res.headers.iter() {
        if f.name.eq_ignore_ascii_case("connection") || f.name.eq_ignore_ascii_case("keep-alive") {
            continue;
        }
        out.extend_from_slice(f.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(f.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Some((out, len)))
}

/// Copies the body `head` announces from `from` to `to`, in the framing the forwarded head
/// announces: exactly `Content-Length` bytes, or a chunked body re-encoded (chunk extensions
/// and trailers dropped, every size line checked). Stops there: what the client sends after
/// the body is never read.
pub fn relay_body(body: Body, from: &mut impl BufRead, to: &mut impl Write) -> io::Result<()> {
    match body {
        Body::None => Ok(()),
        Body::Length(n) => copy_exact(from, to, n),
        Body::Chunked => relay_chunked(from, to),
    }
}

fn copy_exact(from: &mut impl BufRead, to: &mut impl Write, n: u64) -> io::Result<()> {
    let copied = io::copy(&mut from.take(n), to)?;
    if copied < n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the client closed before the end of the body",
        ));
    }
    Ok(())
}

/// One line (up to [`MAX_CHUNK_LINE`]) ending in CRLF, CRLF included.
fn chunk_line(from: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    from.take(MAX_CHUNK_LINE).read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a chunked body line is too long, not CRLF-terminated or cut short",
        ));
    }
    Ok(line)
}

fn relay_chunked(from: &mut impl BufRead, to: &mut impl Write) -> io::Result<()> {
    let invalid = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_owned());
    loop {
        let line = chunk_line(from)?;
        if !line[0].is_ascii_hexdigit() {
            return Err(invalid("a chunk size is not a hex number"));
        }
        let size = match httparse::parse_chunk_size(&line) {
            Ok(httparse::Status::Complete((n, size))) if n == line.len() => size,
            _ => return Err(invalid("a chunk size line is malformed")),
        };
        if size == 0 {
            // Trailer fields are dropped (the forwarded head announces none).
            let mut trailers = 0;
            loop {
                let line = chunk_line(from)?;
                if line == b"\r\n" {
                    break;
                }
                trailers += line.len();
                if trailers > MAX_HEAD {
                    return Err(invalid("chunked body trailers are too large"));
                }
            }
            return to.write_all(b"0\r\n\r\n");
        }
        write!(to, "{size:x}\r\n")?;
        copy_exact(from, to, size)?;
        let mut crlf = [0u8; 2];
        from.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(invalid("a chunk is longer than its size says"));
        }
        to.write_all(b"\r\n")?;
        // Each chunk goes on at once (a streamed response: server-sent events, tokens).
        to.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<RequestHead, HeadError> {
        match parse_request_head(s.as_bytes())? {
            Some((h, n)) => {
                assert_eq!(n, s.find("\r\n\r\n").unwrap() + 4, "{s:?}");
                Ok(h)
            }
            None => panic!("incomplete: {s:?}"),
        }
    }

    fn refused(s: &str) -> HeadError {
        parse(s).expect_err(s)
    }

    #[test]
    fn response_framing() {
        let p = |s: &str, head: bool| parse_response_head(s.as_bytes(), head).unwrap().unwrap();
        let r = p("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false);
        assert_eq!(
            (r.body, r.close, r.len),
            (ResponseBody::Length(5), false, 38)
        );
        assert_eq!(
            p("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true).body,
            ResponseBody::None
        );
        assert_eq!(
            p(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                false
            )
            .body,
            ResponseBody::Chunked
        );
        assert_eq!(
            p("HTTP/1.1 200 OK\r\n\r\n", false).body,
            ResponseBody::UntilClose
        );
        assert!(
            p(
                "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n",
                false
            )
            .close
        );
        assert!(p("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false).close);
        assert_eq!(
            p("HTTP/1.1 100 Continue\r\n\r\n", false).body,
            ResponseBody::None
        );
        assert!(parse_response_head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            false
        )
        .is_err());
        assert!(parse_response_head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            false
        )
        .is_err());
        assert_eq!(
            parse_response_head(b"HTTP/1.1 200 OK\r\n", false).unwrap(),
            None
        );
    }

    #[test]
    fn response_heads_are_told_to_close() {
        let (h, len) = close_response_head(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok",
        )
        .unwrap()
        .unwrap();
        assert_eq!(len, 85, "the head, without the body");
        assert_eq!(
            h,
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        );
        let (h, _) = close_response_head(b"HTTP/1.1 100 Continue\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.is_empty());
        assert_eq!(close_response_head(b"HTTP/1.1 200 OK\r\n").unwrap(), None);
        assert!(close_response_head(b"HTTP/9 x\r\n\r\n").is_err());
    }

    #[test]
    fn connect_and_absolute_form() {
        let h = parse("CONNECT PyPI.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n").unwrap();
        assert!(h.connect);
        assert_eq!((h.host.as_str(), h.port), ("pypi.org", 443));
        let h = parse(
            "GET http://127.0.0.1:8080/a?b=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        assert!(!h.connect);
        assert_eq!(
            (h.host.as_str(), h.port, h.body),
            ("127.0.0.1", 8080, Body::None)
        );
        assert_eq!(
            String::from_utf8(h.forward).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        // HTTP/1.0 without Host; a query without a path; the default port.
        let h = parse("GET http://[::1]?q HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!((h.host.as_str(), h.port), ("::1", 80));
        assert!(String::from_utf8(h.forward)
            .unwrap()
            .starts_with("GET /?q HTTP/1.0\r\nHost: [::1]\r\n"));
        let h = parse("GET HTTP://Example.COM HTTP/1.1\r\nHost: example.com:80\r\n\r\n").unwrap();
        assert_eq!((h.host.as_str(), h.port), ("example.com", 80));
        assert_eq!(
            parse_request_head(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n").unwrap(),
            None
        );
    }

    #[test]
    fn bodies_are_framed_by_the_proxy() {
        let h = parse("POST http://a/x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert_eq!(h.body, Body::Length(5));
        assert!(String::from_utf8_lossy(&h.forward)
            .contains("\r\nContent-Length: 5\r\nConnection: close\r\n"));
        let h = parse(
            "POST http://a/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n\r\n",
        )
        .unwrap();
        assert_eq!(h.body, Body::Chunked);
        let fwd = String::from_utf8(h.forward).unwrap();
        assert!(fwd.contains("Transfer-Encoding: chunked\r\n"), "{fwd}");
        assert!(
            !fwd.contains("X-Secret") && !fwd.contains("keep-alive"),
            "{fwd}"
        );

        let mut out = Vec::new();
        let mut body = &b"5;ext=1\r\nhello\r\n0001\r\n!\r\n0\r\nX-Trailer: t\r\n\r\nGET http://evil/ HTTP/1.1\r\n\r\n"[..];
        relay_body(Body::Chunked, &mut body, &mut out).unwrap();
        assert_eq!(out, b"5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n");
        assert!(
            body.starts_with(b"GET http://evil/"),
            "the rest is left unread"
        );
        let mut out = Vec::new();
        let mut body = &b"helloGET /smuggled"[..];
        relay_body(Body::Length(5), &mut body, &mut out).unwrap();
        assert_eq!(out, b"hello");
        for bad in [
            &b"5\r\nhelloXX0\r\n\r\n"[..],
            b"5\nhello\r\n0\r\n\r\n",
            b"zz\r\n",
            b"-1\r\n",
            b";\r\n",
            b"ffffffffffffffffff\r\n",
            b"5\r\nhel",
        ] {
            assert!(
                relay_body(Body::Chunked, &mut &bad[..], &mut Vec::new()).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn smuggling_and_hostile_heads_are_refused() {
        let check = |req: &str, status: u16, why: &str| {
            let e = refused(req);
            assert_eq!(e.status, status, "{req:?}: {e:?}");
            assert!(e.message.contains(why), "{req:?}: {e:?}");
        };
        // Bodies framed twice or wrongly (the fields after a `POST` to http://a/ with `Host: a`).
        for (fields, status, why) in [
            (
                "Content-Length: 4\r\nTransfer-Encoding: chunked",
                400,
                "both Transfer-Encoding and Content-Length",
            ),
            (
                "Content-Length: 4\r\nContent-Length: 4",
                400,
                "two Content-Length",
            ),
            ("Content-Length: 4, 4", 400, "not a number"),
            ("Content-Length: +4", 400, "not a number"),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
                400,
                "two Transfer-Encoding",
            ),
            ("Transfer-Encoding: gzip, chunked", 501, "only chunked"),
            ("Transfer-Encoding: xchunked", 501, "only chunked"),
        ] {
            check(
                &format!("POST http://a/ HTTP/1.1\r\nHost: a\r\n{fields}\r\n\r\n"),
                status,
                why,
            );
        }
        let cases: &[(&str, u16, &str)] = &[
            ("POST http://a/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "HTTP/1.0"),
            // obs-fold: a field continued on the next line.
            ("GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n", 400, "malformed"),
            // Bare LF and bare CR.
            ("GET http://a/ HTTP/1.1\nHost: a\r\n\r\n", 400, "CRLF"),
            ("GET http://a/ HTTP/1.1\r\nHost: a\nTransfer-Encoding: chunked\r\n\r\n", 400, "CRLF"),
            ("GET http://a/ HTTP/1.1\r\nHost: a\rX: y\r\n\r\n", 400, ""),
            // Host: twice, or another host or port than the target.
            ("GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "two Host"),
            ("GET http://allowed.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", 400, "not the request target"),
            ("GET http://a:8080/ HTTP/1.1\r\nHost: a\r\n\r\n", 400, "not the request target"),
            // Targets.
            ("GET /relative HTTP/1.1\r\nHost: a\r\n\r\n", 400, "http:// URLs"),
            ("GET https://a/ HTTP/1.1\r\nHost: a\r\n\r\n", 400, "http:// URLs"),
            ("GET http://evil.example@allowed.example/ HTTP/1.1\r\n\r\n", 400, "user info"),
            ("GET http://a/#frag HTTP/1.1\r\n\r\n", 400, "fragment"),
            ("GET http://a%2eb/ HTTP/1.1\r\n\r\n", 400, "not a host name"),
            ("GET http://a:0/ HTTP/1.1\r\n\r\n", 400, "bad port"),
            ("GET http://a:99999/ HTTP/1.1\r\n\r\n", 400, "bad port"),
            ("GET http://[::1/ HTTP/1.1\r\n\r\n", 400, "']'"),
            ("CONNECT host HTTP/1.1\r\n\r\n", 400, "host:port"),
            ("CONNECT a:443 HTTP/1.1\r\nContent-Length: 3\r\n\r\n", 400, "CONNECT request with a body"),
            ("CONNECT [zz]:443 HTTP/1.1\r\n\r\n", 400, "IPv6"),
            // Versions and garbage.
            ("GET http://a/ HTTP/2.0\r\n\r\n", 400, "malformed"),
            ("garbage\r\n\r\n", 400, "malformed"),
            ("GET http://a/ HTTP/1.1\r\nBad Name: x\r\n\r\n", 400, "malformed"),
            ("GET http://a/ HTTP/1.1\r\nX: a\0b\r\n\r\n", 400, "malformed"),
        ];
        for (req, status, why) in cases {
            check(req, *status, why);
        }
        // Too many fields, and a head over the limit (one very long field).
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        let e = refused(&format!("GET http://a/ HTTP/1.1\r\n{many}\r\n"));
        assert_eq!(e.status, 431);
        let long = format!(
            "GET http://a/ HTTP/1.1\r\nX: {}\r\n\r\n",
            "v".repeat(MAX_HEAD)
        );
        assert_eq!(refused(&long).status, 431);
        let unfinished = format!("GET http://a/ HTTP/1.1\r\nX: {}", "v".repeat(MAX_HEAD));
        assert_eq!(
            parse_request_head(unfinished.as_bytes())
                .unwrap_err()
                .status,
            431
        );
    }
}
