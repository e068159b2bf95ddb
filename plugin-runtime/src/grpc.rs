//! A tower layer that gives every gRPC call a span (method, code,
//! duration) and feeds the per-RPC metrics. It never looks at message
//! bodies, so it cannot log a secret.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tower::{Layer, Service};
use tracing::Instrument;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

/// Per-RPC counters, latency histograms and in-flight gauges.
#[derive(Clone, Debug)]
pub struct GrpcMetrics {
    /// Calls being served right now, all methods: shutdown waits for zero.
    in_flight_total: Arc<AtomicUsize>,
    calls: Family<CallLabels, Counter>,
    latency: Family<MethodLabels, Histogram, fn() -> Histogram>,
    in_flight: Family<MethodLabels, Gauge>,
}

impl Default for GrpcMetrics {
    fn default() -> Self {
        fn histogram() -> Histogram {
            // 0.5 ms .. ~65 s
            Histogram::new(exponential_buckets(0.0005, 2.0, 18))
        }
        Self {
            in_flight_total: Arc::new(AtomicUsize::new(0)),
            calls: Family::default(),
            latency: Family::new_with_constructor(histogram),
            in_flight: Family::default(),
        }
    }
}

impl GrpcMetrics {
    /// How many calls are being served now.
    pub fn in_flight(&self) -> usize {
        self.in_flight_total.load(Ordering::SeqCst)
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "grpc_server_handled",
            "gRPC calls completed, by method and status code",
            self.calls.clone(),
        );
        registry.register(
            "grpc_server_handling_seconds",
            "gRPC call latency, by method",
            self.latency.clone(),
        );
        registry.register(
            "grpc_server_in_flight",
            "gRPC calls being served, by method",
            self.in_flight.clone(),
        );
    }
}

/// The label of a call whose path names no method of ours.
pub const UNKNOWN_METHOD: &str = "unknown";

/// A call's method for labels: one of the protos' methods, else
/// [`UNKNOWN_METHOD`], so that callers cannot grow the metrics with paths
/// of their own.
pub fn method_label(path: &str) -> &'static str {
    proto::GRPC_METHODS
        .iter()
        .find(|m| **m == path)
        .copied()
        .unwrap_or(UNKNOWN_METHOD)
}

/// `tonic::Code` names as Prometheus and logs show them.
pub fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "Canceled",
        2 => "Unknown",
        3 => "InvalidArgument",
        4 => "DeadlineExceeded",
        5 => "NotFound",
        6 => "AlreadyExists",
        7 => "PermissionDenied",
        8 => "ResourceExhausted",
        9 => "FailedPrecondition",
        10 => "Aborted",
        11 => "OutOfRange",
        12 => "Unimplemented",
        13 => "Internal",
        14 => "Unavailable",
        15 => "DataLoss",
        16 => "Unauthenticated",
        _ => "Unknown",
    }
}

#[derive(Clone, Debug)]
pub struct ObserveLayer {
    metrics: GrpcMetrics,
}

impl ObserveLayer {
    pub fn new(metrics: GrpcMetrics) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Observe {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Observe<S> {
    inner: S,
    metrics: GrpcMetrics,
}

impl<S, B, R> Service<http::Request<B>> for Observe<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Send,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = method_label(req.uri().path()).to_string();
        let span = if method == UNKNOWN_METHOD {
            let asked: String = req.uri().path().chars().take(128).collect();
            tracing::info_span!("rpc", method = %method, path = ?asked, code = tracing::field::Empty, duration_ms = tracing::field::Empty)
        } else {
            tracing::info_span!("rpc", method = %method, code = tracing::field::Empty, duration_ms = tracing::field::Empty)
        };
        let metrics = self.metrics.clone();
        let labels = MethodLabels {
            method: method.clone(),
        };
        metrics.in_flight.get_or_create(&labels).inc();
        let guard = InFlight::new(metrics.in_flight_total.clone());
        let started = Instant::now();
        let fut = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        Box::pin(
            async move {
                let result = fut.await;
                drop(guard);
                let elapsed = started.elapsed();
                // tonic sends errors as trailers-only responses, with the
                // status in the headers; a success carries no grpc-status
                // header here (it comes in the trailers)
                let code = match &result {
                    Ok(resp) => resp
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i32>().ok())
                        .unwrap_or(0),
                    Err(_) => 2,
                };
                let name = code_name(code);
                let span = tracing::Span::current();
                span.record("code", name);
                span.record("duration_ms", elapsed.as_secs_f64() * 1000.0);
                metrics.in_flight.get_or_create(&labels).dec();
                metrics
                    .calls
                    .get_or_create(&CallLabels {
                        method: labels.method.clone(),
                        code: name.to_string(),
                    })
                    .inc();
                metrics
                    .latency
                    .get_or_create(&labels)
                    .observe(elapsed.as_secs_f64());
                match &result {
                    Ok(_) if code == 0 => tracing::debug!("rpc ok"),
                    Ok(_) => tracing::info!("rpc failed"),
                    Err(e) => tracing::warn!(error = %e, "rpc transport error"),
                }
                result
            }
            .instrument(span),
        )
    }
}

/// Counts a call as in flight until it completes or is dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(counter: Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
