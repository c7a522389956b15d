//! `default_provider` and `model_aliases`: the bare ids and aliases a
//! request's `model` may name.

use super::{ConfigError, GatewayConfig};
use crate::body::ModelNames;

impl GatewayConfig {
    /// `default_provider` and `model_aliases` as one [`ModelNames`]; the
    /// first setting it refuses, by its path.
    pub(super) fn model_names(&self) -> Result<ModelNames, ConfigError> {
        let mut names = ModelNames::new();
        if let Some(provider) = &self.default_provider {
            names = names.default_provider(provider).map_err(ConfigError::new)?;
        }
        // In name order, so that of two bad entries the same one is named.
        let mut aliases: Vec<(&String, &String)> = self.model_aliases.iter().collect();
        aliases.sort();
        for (name, target) in aliases {
            names = names.alias(name, target).map_err(ConfigError::new)?;
        }
        Ok(names)
    }
}
