/// Response future of [`GlobalRateLimit`](super::GlobalRateLimit): the
/// counter check, then the inner service.
pub type ResponseFuture<S, B> = crate::limiter::AdmissionFuture<S, B>;
