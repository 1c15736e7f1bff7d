//! `tollgate import nginx`: the common subset of an nginx.conf.

use super::output::{Import, ImportError};

/// Converts one nginx.conf (name, text).
pub fn convert(files: &[(String, String)]) -> Result<Import, ImportError> {
    let _ = files;
    Err(ImportError::Invalid("not yet".into()))
}
