//! In-flight slots: whether a holder gets (or keeps) a place in a slot set.

use std::time::Duration;

use crate::store::SlotOutcome;
use crate::store::counter::micros_duration;

/// What one slot set holds at the instant of a call, its ended leases left
/// out (a lease ending at `t` is held while `now < t`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotsView {
    /// Live leases.
    pub(crate) held: u64,
    /// When the earliest live lease ends (µs).
    pub(crate) earliest_end_micros: Option<i64>,
    /// Whether the caller holds one of them already (a renewal).
    pub(crate) renewing: bool,
}

/// Decides an acquisition: a holder renewing its lease always keeps it; a
/// new one gets a place below `limit`. `Some(lease end)` to write, with the
/// outcome.
pub(crate) fn acquire(
    view: SlotsView,
    limit: u64,
    lease_micros: i64,
    now_micros: i64,
) -> (SlotOutcome, Option<i64>) {
    if !view.renewing && view.held >= limit {
        let earliest_micros = view.earliest_end_micros.unwrap_or(now_micros);
        return (
            SlotOutcome {
                acquired: false,
                held: view.held,
                limit,
                retry_after: micros_duration(earliest_micros.saturating_sub(now_micros)),
            },
            None,
        );
    }
    (
        SlotOutcome {
            acquired: true,
            held: if view.renewing {
                view.held
            } else {
                view.held + 1
            },
            limit,
            retry_after: Duration::ZERO,
        },
        Some(now_micros.saturating_add(lease_micros)),
    )
}
