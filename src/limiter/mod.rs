//! The counter check both limit layers make: one atomic `check_and_add`,
//! the layer's failure policy, and a memo of counters known to be full;
//! the `X-RateLimit-*` headers they answer with; the admission plan.
//!
//! The memo: a counter the store reported full is remembered (per scope,
//! counter and `Limit`) until the wait the store reported has passed,
//! measured locally from the answer, so clock skew does not matter; a
//! request that would hit it is refused with no round trip (not for the
//! purchase-tiered check, whose capacity a top-up raises). It only ever
//! refuses what the store would, never admits, and holds at most
//! `MAX_REMEMBERED` (10,000) entries; the layers'
//! `remember_full_counters(false)` turns it off.

mod check;
pub(crate) mod headers;
mod plan;

pub(crate) use check::{Limiter, Verdict};
pub use plan::AdmissionFuture;
pub(crate) use plan::{Additions, Admission, AdmissionPlan, Decision, Finish, PlannedChecks};
