//! Prometheus metrics for OpenStack API calls. Names and the `request`
//! label match the upstream plugins' (`openstack_api_requests_total{request="volume_create"}`),
//! so existing dashboards keep working; `service` and `status` are added.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    service: &'static str,
    request: &'static str,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    service: &'static str,
    request: &'static str,
}

type HistogramFamily = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// Cheap to clone: every clone feeds the same series.
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    requests: Family<CallLabels, Counter>,
    errors: Family<OperationLabels, Counter>,
    duration: HistogramFamily,
    throttle_wait: Family<OperationLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        fn histogram() -> Histogram {
            // 5 ms .. ~82 s
            Histogram::new(exponential_buckets(0.005, 2.0, 15))
        }
        Self {
            requests: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(histogram),
            throttle_wait: Family::default(),
        }
    }
}

impl ApiMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "openstack_api_requests",
            "OpenStack API requests by operation and HTTP status (or transport error)",
            self.requests.clone(),
        );
        registry.register(
            "openstack_api_request_errors",
            "OpenStack API requests that failed (HTTP status >= 400 or transport error)",
            self.errors.clone(),
        );
        registry.register(
            "openstack_api_request_duration_seconds",
            "Latency of OpenStack API requests, per attempt",
            self.duration.clone(),
        );
        registry.register(
            "openstack_api_throttle_wait_seconds",
            "Time requests waited because the service asked (429 or a busy 409 with its retry hint: Retry-After, X-Retry-After, X-RateLimit-Retry-After) before they were sent again",
            self.throttle_wait.clone(),
        );
    }

    /// Time a request waited because its service asked it to.
    pub(crate) fn throttled(&self, service: &'static str, request: &'static str, waited: Duration) {
        self.throttle_wait
            .get_or_create(&OperationLabels { service, request })
            .inc_by(waited.as_secs_f64());
    }

    /// `status` is the HTTP status, or `error` for a transport failure.
    pub(crate) fn observe(
        &self,
        service: &'static str,
        request: &'static str,
        status: Option<u16>,
        elapsed: Duration,
    ) {
        let status_label = status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "error".to_string());
        self.requests
            .get_or_create(&CallLabels {
                service,
                request,
                status: status_label,
            })
            .inc();
        if status.is_none_or(|s| s >= 400) {
            self.errors
                .get_or_create(&OperationLabels { service, request })
                .inc();
        }
        self.duration
            .get_or_create(&OperationLabels { service, request })
            .observe(elapsed.as_secs_f64());
    }
}
