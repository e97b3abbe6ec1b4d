//! The HTTP layer: routes, middleware, extractors. Handlers extract, call a
//! service and map the result; the flows live in `domain`. This layer may
//! import the domain and the ports' types, never the wiring (`startup`
//! builds [`AppState`] and calls [`router`]).

mod admin;
mod agents;
pub mod audit;
mod conditional;
mod dead_letters;
pub mod drain;
pub mod error;
mod events;
mod extract;
mod files;
mod health;
mod keys;
mod links;
mod listing;
mod me;
mod multipart;
mod page;
mod precommit;
mod scopes;
mod sessions;
mod state;
mod tokens;
mod tus;
mod users;

pub use self::state::AppState;

use std::time::{Duration, Instant};

use axum::{
    Router,
    extract::{DefaultBodyLimit, MatchedPath, Request, State},
    http::{HeaderName, HeaderValue, Method, header},
    middleware::{self, Next},
    response::Response,
    routing::{MethodFilter, on},
};
use tower::ServiceBuilder;
use tower_http::{
    catch_panic::CatchPanicLayer,
    cors::{AllowOrigin, CorsLayer},
    request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer},
    trace::TraceLayer,
};

use self::error::{ApiError, REQUEST_ID};
pub use self::extract::JSON_BODY_LIMIT;
use crate::domain::DomainError;
use crate::metrics::{HttpLabels, Metrics, RouteLabel};

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Declares every route once: the router is built from it, and
/// [`ROUTES`] lists it for the OpenAPI conformance test.
macro_rules! api {
    ($( $method:ident $path:literal => $handler:path ),* $(,)?) => {
        /// Every (method, path) the router serves.
        pub const ROUTES: &[(&str, &str)] = &[ $( (stringify!($method), $path) ),* ];

        /// The routes whose path `serves` accepts.
        fn api_routes(serves: impl Fn(&str) -> bool) -> Router<AppState> {
            let mut router = Router::new();
            $( if serves($path) {
                router = router.route($path, on(MethodFilter::$method, $handler));
            } )*
            router
        }
    };
}

api! {
    GET "/" => page::index,
    GET "/healthz" => health::healthz,
    GET "/readyz" => health::readyz,
    GET "/metrics" => health::metrics,
    GET "/v1/admin/users" => users::list,
    POST "/v1/admin/users" => admin::create_user,
    GET "/v1/admin/users/{id}" => users::get,
    PATCH "/v1/admin/users/{id}" => users::update,
    DELETE "/v1/admin/users/{id}" => users::delete,
    GET "/v1/admin/users/{id}/keys" => keys::admin_list,
    POST "/v1/admin/users/{id}/keys" => keys::admin_create,
    DELETE "/v1/admin/users/{id}/keys/{key_id}" => keys::admin_revoke,
    GET "/v1/admin/orphans" => admin::orphans,
    POST "/v1/admin/sweep" => admin::sweep,
    GET "/v1/admin/queue" => admin::queue,
    GET "/v1/admin/events/dead" => dead_letters::list,
    GET "/v1/precommit/{id}" => precommit::read,
    POST "/v1/admin/events/dead/{id}/replay" => dead_letters::replay,
    DELETE "/v1/admin/events/dead/{id}" => dead_letters::discard,
    GET "/v1/me" => me::me,
    GET "/v1/events" => events::list,
    GET "/v1/me/keys" => keys::my_list,
    POST "/v1/me/keys" => keys::my_create,
    DELETE "/v1/me/keys/{key_id}" => keys::my_revoke,
    POST "/v1/tokens" => tokens::mint,
    POST "/v1/files" => files::upload,
    GET "/v1/files" => files::list,
    GET "/v1/files/{id}" => files::get,
    PATCH "/v1/files/{id}" => files::rename,
    DELETE "/v1/files/{id}" => files::delete,
    GET "/v1/files/{id}/content" => files::content,
    POST "/v1/files/{id}/links" => links::create,
    GET "/v1/links/{id}" => links::download,
    OPTIONS "/v1/uploads" => tus::options,
    POST "/v1/uploads" => tus::create,
    OPTIONS "/v1/uploads/{id}" => tus::options,
    HEAD "/v1/uploads/{id}" => tus::head,
    PATCH "/v1/uploads/{id}" => tus::patch,
    DELETE "/v1/uploads/{id}" => tus::terminate,
    POST "/v1/sessions" => sessions::create,
    GET "/v1/sessions" => sessions::list,
    GET "/v1/sessions/{id}" => sessions::get,
    DELETE "/v1/sessions/{id}" => sessions::delete,
    POST "/v1/sessions/{id}/files" => sessions::attach,
    DELETE "/v1/sessions/{id}/files/{file_id}" => sessions::detach,
    POST "/v1/agents" => agents::create,
    GET "/v1/agents" => agents::list,
    GET "/v1/agents/{id}" => agents::get,
    DELETE "/v1/agents/{id}" => agents::delete,
    POST "/v1/agents/{id}/files" => agents::attach,
    DELETE "/v1/agents/{id}/files/{file_id}" => agents::detach,
    PUT "/v1/agents/{id}/mcps/{mcp_id}" => agents::connect_mcp,
    DELETE "/v1/agents/{id}/mcps/{mcp_id}" => agents::disconnect_mcp,
    PUT "/v1/agents/{id}/toolsets/{toolset_id}" => agents::connect_toolset,
    DELETE "/v1/agents/{id}/toolsets/{toolset_id}" => agents::disconnect_toolset,
}

/// The path of the metrics, served by [`metrics_router`] instead when
/// `FILEDOCK_METRICS_ADDR` is set.
pub const METRICS_PATH: &str = "/metrics";

pub fn router(state: AppState) -> Router {
    let cors = cors(&state.settings.cors_origins);
    let metrics_apart = state.settings.metrics_addr.is_some();
    api_routes(|path| !(metrics_apart && path == METRICS_PATH))
        .fallback(|| async { ApiError::from(DomainError::NotFound) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        // For JSON bodies; uploads stream their bodies and enforce their own limit.
        .layer(DefaultBodyLimit::max(JSON_BODY_LIMIT))
        .layer(
            ServiceBuilder::new()
                // Outermost: every answer of a draining instance, a
                // panic's 500 included, closes its connection.
                .layer(middleware::from_fn_with_state(
                    state.clone(),
                    close_connections_while_draining,
                ))
                .layer(middleware::from_fn(sanitize_request_id))
                .layer(SetRequestIdLayer::new(X_REQUEST_ID, MakeRequestUuid))
                .layer(PropagateRequestIdLayer::new(X_REQUEST_ID))
                .layer(TraceLayer::new_for_http().make_span_with(|req: &Request| {
                    let route = req
                        .extensions()
                        .get::<MatchedPath>()
                        .map_or(req.uri().path(), MatchedPath::as_str);
                    let id = req
                        .headers()
                        .get(X_REQUEST_ID)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    tracing::info_span!("request", method = %req.method(), route, request_id = id)
                }))
                .layer(middleware::from_fn_with_state(state.clone(), observe))
                // Inside `observe`: a panic is answered and counted as a 500.
                .layer(CatchPanicLayer::custom(answer_panic(state.metrics.clone())))
                .layer(middleware::from_fn(tus::tus_resumable_header))
                .option_layer(cors),
        )
        .with_state(state)
}

/// `/metrics` alone, for the listener at `FILEDOCK_METRICS_ADDR`.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route(METRICS_PATH, axum::routing::get(health::metrics))
        .fallback(|| async { ApiError::from(DomainError::NotFound) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

/// Makes the request id available to error bodies and counts the request.
async fn observe(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = req
        .headers()
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let method = method_label(req.method()).to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let res = REQUEST_ID.scope(id, next.run(req)).await;
    let m: &Metrics = &state.metrics;
    m.http_duration
        .get_or_create(&RouteLabel {
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    m.http_requests
        .get_or_create(&HttpLabels {
            method,
            route,
            status: res.status().as_u16(),
        })
        .inc();
    res
}

/// A handler that panicked is a bug: the client gets the documented `500
/// internal` (with its request id; the panic message only goes to the log),
/// the panic is counted, and the connection stays up.
fn answer_panic(
    metrics: std::sync::Arc<Metrics>,
) -> impl Fn(Box<dyn std::any::Any + Send>) -> Response + Clone {
    move |panic| {
        metrics.http_panics.inc();
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        axum::response::IntoResponse::into_response(ApiError::internal(anyhow::anyhow!(
            "handler panicked: {message}"
        )))
    }
}

/// The `method` label: a client may send any token as a method, and each
/// would be a new series for ever, so those outside RFC 9110 are `other`.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    KNOWN
        .iter()
        .find(|m| *m == method)
        .map_or("other", |m| m.as_str())
}

/// Drops a client's `x-request-id` unless it is a short token, so that a new
/// one is made: it is echoed and logged, and must not carry anything else.
async fn sanitize_request_id(mut req: Request, next: Next) -> Response {
    let valid = |v: &HeaderValue| {
        (1..=MAX_REQUEST_ID).contains(&v.len())
            && v.as_bytes()
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b".-_".contains(b))
    };
    if req.headers().get(X_REQUEST_ID).is_some_and(|v| !valid(v)) {
        req.headers_mut().remove(X_REQUEST_ID);
    }
    next.run(req).await
}

/// The longest request id a client may choose.
const MAX_REQUEST_ID: usize = 128;

fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([
                Method::GET,
                Method::HEAD,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ])
            .allow_headers(
                [
                    header::AUTHORIZATION,
                    header::CONTENT_TYPE,
                    header::RANGE,
                    header::IF_NONE_MATCH,
                    header::IF_MATCH,
                    header::IF_RANGE,
                    header::IF_MODIFIED_SINCE,
                    HeaderName::from_static("idempotency-key"),
                    HeaderName::from_static("content-digest"),
                ]
                .into_iter()
                .chain(tus::REQUEST_HEADERS)
                .collect::<Vec<_>>(),
            )
            .expose_headers(
                [
                    X_REQUEST_ID,
                    header::LOCATION,
                    header::ETAG,
                    header::CONTENT_DISPOSITION,
                    header::CONTENT_RANGE,
                    header::LAST_MODIFIED,
                    HeaderName::from_static("repr-digest"),
                ]
                .into_iter()
                .chain(tus::RESPONSE_HEADERS.map(HeaderName::from_static))
                .collect::<Vec<_>>(),
            )
            .max_age(Duration::from_secs(600)),
    )
}

/// Every response of an unready instance closes its connection: a client
/// (or balancer) that keeps connections open opens its next one elsewhere
/// before the listener closes.
pub async fn close_connections_while_draining(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    if state.drain.is_unready() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}
