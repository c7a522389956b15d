//! Records: whether a conditional write or delete may go ahead.

use crate::store::Expect;

/// Whether `expect` holds for a record at `current_revision` (`None`: no
/// live record).
pub(crate) fn expectation_holds(current_revision: Option<u64>, expect: Expect) -> bool {
    match (expect, current_revision) {
        (Expect::Any, _) => true,
        (Expect::Absent, current) => current.is_none(),
        (Expect::Revision(revision), Some(current)) => current == revision,
        (Expect::Revision(_), None) => false,
    }
}
