use tower_layer::Layer;

use super::SettingsPage;

/// Applies [`SettingsPage`] to a service: answers `/settings` and the
/// paths under it, passes every other request on. See the
/// [module docs](super).
///
/// Holds nothing: the page is compiled into the crate.
#[derive(Clone, Copy, Debug, Default)]
pub struct SettingsPageLayer {
    _private: (),
}

impl SettingsPageLayer {
    /// Serves the page at [`PATH`](super::PATH).
    pub fn new() -> Self {
        SettingsPageLayer::default()
    }
}

impl<S> Layer<S> for SettingsPageLayer {
    type Service = SettingsPage<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SettingsPage { inner }
    }
}
