//! [`Reloadable`]: a configuration built from files, rebuilt from them on
//! [`Reloadable::reload`] and swapped in for the connections made after
//! it; [`ServerTls`](crate::ServerTls) and [`ClientTls`](crate::ClientTls)
//! are this over their files.

use std::sync::{Arc, PoisonError, RwLock};

use crate::TlsError;

/// Files a configuration is built from.
pub trait TlsFiles {
    type Config;
    fn build(&self) -> Result<Self::Config, TlsError>;
}

/// `F`'s configuration, swappable while connections are made with it.
#[derive(Debug)]
pub struct Reloadable<F: TlsFiles> {
    files: F,
    current: RwLock<Arc<F::Config>>,
}

impl<F: TlsFiles> Reloadable<F> {
    /// Reads the files; any problem with them is an error now, not at the
    /// first connection.
    pub fn load(files: F) -> Result<Self, TlsError> {
        let config = files.build()?;
        Ok(Reloadable {
            files,
            current: RwLock::new(Arc::new(config)),
        })
    }

    pub fn files(&self) -> &F {
        &self.files
    }

    /// Reads the files again and makes new connections with what they
    /// hold. On an error (a half-written file, a key that does not match
    /// the new certificate) the previous configuration stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = Arc::new(self.files.build()?);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = config;
        Ok(())
    }

    /// The configuration new connections use now.
    pub(crate) fn current(&self) -> Arc<F::Config> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }
}
