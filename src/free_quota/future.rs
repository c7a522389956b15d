/// Response future of [`FreeModelQuota`](super::FreeModelQuota): the quota
/// check, then the inner service.
pub type ResponseFuture<S, B> = crate::limiter::AdmissionFuture<S, B>;
