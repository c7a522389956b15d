//! Admission: how the deciding layers decide, alone or together.
//!
//! Used alone, each of [`GlobalRateLimit`], [`FreeModelQuota`] and
//! [`CreditGuard`] decides by itself, each in
//! its own store step. Stacked by [`AdmissionLayers`] (as the proxy does),
//! the first two do not decide: each hands its checks to CreditGuard in an
//! admission plan in the request's context, and CreditGuard decides
//! every check and its credit hold in one atomic store step
//! ([`LedgerStore::admit`](crate::store::LedgerStore::admit); on Redis one
//! script). A request refused by any of them counts in none: no rate, no
//! free quota, no hold. Each layer still words its own refusals and adds
//! its own headers.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use modelgate::admission::AdmissionLayers;
//! use modelgate::auth::BearerAuthLayer;
//! use modelgate::body::BodyLimitLayer;
//! use modelgate::credit::{CreditGuardLayer, PriceTable};
//! use modelgate::free_quota::FreeModelQuotaLayer;
//! use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
//! use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
//! use modelgate::store::MemoryStore;
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let directory = KeyDirectory::new(store.clone());
//! let (key, _) = directory.create_key(NewKey::named("app")).await.unwrap();
//! let rules = RateLimitRules::from_json(r#"{"account": {"rolling": {"requests": 100, "window_seconds": 60}}}"#).unwrap();
//! let prices = PriceTable::from_json(r#"{"models": {"openai/gpt-4o": {"prompt_per_million": 1, "completion_per_million": 1}}}"#).unwrap();
//! let admission = AdmissionLayers::new(
//!     GlobalRateLimitLayer::new(store.clone(), rules).unwrap(),
//!     FreeModelQuotaLayer::new(store.clone()),
//!     CreditGuardLayer::new(store.clone(), Arc::new(prices)),
//! );
//! let upstream = service_fn(|_: Request<Full<Bytes>>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
//! });
//! let gateway = ServiceBuilder::new()
//!     .layer(BearerAuthLayer::new(directory))
//!     .layer(BodyLimitLayer::new())
//!     .layer(admission)
//!     .service(upstream);
//! // The account has bought nothing: a paid model is refused with 402, and
//! // the refusal spent none of its rate.
//! let body = r#"{"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}"#;
//! let chat = Request::post("/api/v1/chat/completions")
//!     .header("authorization", format!("Bearer {}", key.expose()))
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from(body)))
//!     .unwrap();
//! let response = gateway.oneshot(chat).await.unwrap();
//! assert_eq!(response.status(), 402);
//! # }
//! ```

use crate::credit::{CreditGuard, CreditGuardLayer};
use crate::free_quota::{FreeModelQuota, FreeModelQuotaLayer};
use crate::rate_limit::{GlobalRateLimit, GlobalRateLimitLayer};

pub use crate::limiter::AdmissionFuture;

/// [`GlobalRateLimit`], [`FreeModelQuota`] and [`CreditGuard`], in that
/// order, deciding every request in one atomic store step (see the
/// [module docs](self)). Put it where the three would go: after
/// [`BearerAuth`](crate::auth::BearerAuth) and
/// [`BodyLimit`](crate::body::BodyLimit).
#[derive(Clone, Debug)]
pub struct AdmissionLayers {
    rate_limit: GlobalRateLimitLayer,
    free_quota: FreeModelQuotaLayer,
    credit: CreditGuardLayer,
}

impl AdmissionLayers {
    /// The three layers, configured as each alone would be; the first two
    /// hand their checks to the third.
    pub fn new(
        rate_limit: GlobalRateLimitLayer,
        free_quota: FreeModelQuotaLayer,
        credit: CreditGuardLayer,
    ) -> Self {
        AdmissionLayers {
            rate_limit: rate_limit.deferred(),
            free_quota: free_quota.deferred(),
            credit,
        }
    }
}

impl<S> tower_layer::Layer<S> for AdmissionLayers {
    type Service = GlobalRateLimit<FreeModelQuota<CreditGuard<S>>>;

    fn layer(&self, inner: S) -> Self::Service {
        self.rate_limit
            .layer(self.free_quota.layer(self.credit.layer(inner)))
    }
}

impl crate::context::ContextLayer for AdmissionLayers {
    const NAME: &'static str = "AdmissionLayers";

    fn reads(&self) -> &'static [crate::context::ContextPart] {
        use crate::context::ContextPart;
        &[ContextPart::Principal, ContextPart::ParsedBody]
    }
}
