//! The Docker API's routes (an axum [`Router`]) and the server loop that feeds it: every
//! connection on the unix socket is served by hyper's HTTP/1 with upgrades (the hijacked
//! attach and exec streams take the connection over, see [`crate::stream`]). Before routing,
//! a request's `/vX.Y` prefix is taken off ([`crate::http::strip_version`]: 400 for a
//! version not spoken); after it, its answer and time are a `debug` event of [`TRACE`].
//! Unknown paths and methods get dockerd's 404 `page not found` (an empty 404 to `HEAD`).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tower::ServiceExt;

use crate::error::DockerError;
use crate::http::{strip_version, DockerResult, Query, Reply};
use crate::{
    archive, container_api, container_streams, exec, images, system, ApiState, LOG, TRACE,
};

type Api = State<Arc<ApiState>>;
type Key = Path<String>;

/// Every route of the API. Image names contain `/`, so `/images/{*name}` takes the rest of
/// the path and its handlers look at the suffix (`/json`, `/tag`).
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        // system
        .route("/_ping", get(ping).head(ping))
        .route("/version", get(|| async { system::version() }))
        .route(
            "/info",
            get(|State(api): Api| async move { system::info(&api) }),
        )
        // images
        .route(
            "/images/json",
            get(|State(api): Api| async move { images::list(&api) }),
        )
        .route(
            "/images/create",
            post(|State(api): Api, q: Query| async move { images::pull(&api, &q).await }),
        )
        .route(
            "/images/{*name}",
            get(image_get).post(image_post).delete(image_delete),
        )
        .route(
            "/build",
            post(|State(api): Api, q: Query, req: Request| async move {
                images::build(&api, &q, req.into_body()).await
            }),
        )
        // containers
        .route("/commit", post(container_api::commit))
        .route("/containers/create", post(container_api::create))
        .route("/containers/json", get(container_api::list))
        .route("/containers/{key}", delete(container_api::delete))
        .route("/containers/{key}/json", get(container_api::inspect))
        .route("/containers/{key}/start", post(container_api::start))
        .route("/containers/{key}/stop", post(container_api::stop))
        .route("/containers/{key}/restart", post(container_api::restart))
        .route("/containers/{key}/kill", post(container_api::kill))
        .route("/containers/{key}/wait", post(container_streams::wait))
        .route("/containers/{key}/logs", get(container_streams::logs))
        .route("/containers/{key}/attach", post(container_streams::attach))
        .route("/containers/{key}/resize", post(container_api::resize))
        .route("/containers/{key}/exec", post(exec::create))
        .route(
            "/containers/{key}/archive",
            get(archive::get).head(archive::get).put(archive::put),
        )
        // exec
        .route("/exec/{id}/start", post(exec::start))
        .route("/exec/{id}/json", get(exec::inspect))
        .route("/exec/{id}/resize", post(exec::resize))
        .fallback(not_found_route)
        .method_not_allowed_fallback(not_found_route)
        .with_state(state)
}

/// `HEAD /_ping`, `GET /_ping`.
async fn ping(method: Method) -> Reply {
    system::ping(&method)
}

/// `GET /images/{name}/json`.
async fn image_get(State(api): Api, Path(rest): Key, method: Method) -> Response {
    match rest.strip_suffix("/json") {
        Some(name) if method != Method::HEAD => images::inspect(&api, name).into_response(),
        _ => not_found_route(method).await,
    }
}

/// `POST /images/{name}/tag?repo=&tag=`.
async fn image_post(State(api): Api, Path(rest): Key, q: Query) -> Response {
    match rest.strip_suffix("/tag") {
        Some(name) => images::tag(&api, name, &q).into_response(),
        None => not_found_route(Method::POST).await,
    }
}

/// `DELETE /images/{name}?force=`.
async fn image_delete(State(api): Api, Path(name): Key, q: Query) -> DockerResult {
    images::remove(&api, &name, &q)
}

/// dockerd's answer to a path or method it does not serve.
async fn not_found_route(method: Method) -> Response {
    if method == Method::HEAD {
        return crate::http::empty(StatusCode::NOT_FOUND).into_response();
    }
    DockerError::not_found("page not found").into_response()
}

/// The request without its `/vX.Y` path prefix; `Err` is the 400 for a version not spoken.
fn without_version<B>(mut req: hyper::Request<B>) -> Result<hyper::Request<B>, DockerError> {
    let path = req.uri().path();
    let tail = strip_version(path).map_err(DockerError::bad_request)?;
    if tail.len() == path.len() {
        return Ok(req);
    }
    let tail = if tail.is_empty() { "/" } else { tail };
    let path_and_query = match req.uri().query() {
        Some(q) => format!("{tail}?{q}"),
        None => tail.to_owned(),
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(
        path_and_query
            .parse()
            .map_err(|e| DockerError::bad_request(format!("{e}")))?,
    );
    *req.uri_mut() =
        hyper::Uri::from_parts(parts).map_err(|e| DockerError::bad_request(format!("{e}")))?;
    Ok(req)
}

/// One request: routed without its version prefix, traced with its answer and time (a
/// stream's time is the time to its headers).
async fn handle(router: Router, req: hyper::Request<hyper::body::Incoming>) -> Response {
    let traced = tracing::enabled!(target: TRACE, tracing::Level::DEBUG);
    let t0 = std::time::Instant::now();
    let what = traced.then(|| format!("{} {}", req.method(), req.uri()));
    let reply = match without_version(req) {
        Ok(req) => match router.oneshot(req.map(Body::new)).await {
            Ok(r) => r,
            Err(never) => match never {},
        },
        Err(e) => e.into_response(),
    };
    if let Some(what) = what {
        tracing::debug!(
            target: TRACE,
            "{what}: {} in {:.2} ms",
            reply.status().as_u16(),
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    reply
}

/// Accepts connections until `stop`, each served on a task of its own (requests already
/// running end with the runtime).
pub async fn serve(
    listener: std::os::unix::net::UnixListener,
    state: Arc<ApiState>,
    mut stop: oneshot::Receiver<()>,
) {
    let listener = match UnixListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(target: LOG, "docker API: {e}");
            return;
        }
    };
    let router = router(state);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let router = router.clone();
                let conn = crate::stream::ConnFd(std::os::fd::AsRawFd::as_raw_fd(&stream));
                tokio::spawn(async move {
                    let svc = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                        let router = router.clone();
                        req.extensions_mut().insert(conn);
                        async move { Ok::<_, Infallible>(handle(router, req).await) }
                    });
                    let served = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades()
                        .await;
                    if let Err(e) = served {
                        tracing::debug!(target: crate::LOG, "docker API: a connection: {e}");
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_prefix_is_taken_off_the_uri() {
        let req = |uri: &str| hyper::Request::builder().uri(uri).body(()).unwrap();
        let r = without_version(req("/v1.41/containers/json?all=1")).unwrap();
        assert_eq!(r.uri().path(), "/containers/json");
        assert_eq!(r.uri().query(), Some("all=1"));
        let r = without_version(req("/_ping")).unwrap();
        assert_eq!(r.uri().path(), "/_ping");
        let r = without_version(req("/v1.44/images/docker.io%2Flibrary%2Fbusybox/json")).unwrap();
        assert_eq!(r.uri().path(), "/images/docker.io%2Flibrary%2Fbusybox/json");
        let e = without_version(req("/v1.99/info")).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("too new"), "{}", e.message);
    }
}
