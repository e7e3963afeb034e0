//! Preparing and unpreparing claims for the kubelet: reads the claim from the API, plans its
//! devices ([`super::claim::plan`]), writes its CDI spec and the checkpoint. Idempotent (a
//! claim prepared before is answered from the checkpoint, its CDI spec written again if it
//! is gone), serialised (one claim at a time, so an unprepare never overtakes the prepare of
//! the same claim), and it survives restarts (the checkpoint is read at start).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use gpuplace_model::NodeInventory;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::{Mutex, watch};

use super::claim::{self, ClaimError, ClaimRef, PreparedClaim};
use super::state::{CdiSettings, Checkpoint, StateError};

/// Reads ResourceClaims from the API.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim, `None` when it does not exist.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ResourceClaim>, SourceError>> + Send;
}

/// The API could not be asked.
#[derive(Debug, thiserror::Error)]
#[error("cannot read ResourceClaim {namespace}/{name}: {message}")]
pub struct SourceError {
    pub namespace: String,
    pub name: String,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    State(#[from] StateError),
}

/// Where the driver runs and keeps its state.
#[derive(Clone, Debug)]
pub struct PrepareSettings {
    pub driver: String,
    /// This node's name: the pool of its slices.
    pub pool: String,
    pub checkpoint: PathBuf,
    pub cdi: CdiSettings,
}

/// The claims prepared on this node.
pub struct Preparer<S> {
    source: S,
    settings: PrepareSettings,
    inventory: watch::Receiver<Arc<NodeInventory>>,
    state: Mutex<Checkpoint>,
}

impl<S: ClaimSource> Preparer<S> {
    /// Starts from the checkpoint on disk (none: nothing prepared).
    pub fn new(
        source: S,
        settings: PrepareSettings,
        inventory: watch::Receiver<Arc<NodeInventory>>,
    ) -> Result<Preparer<S>, StateError> {
        let state = Checkpoint::load(&settings.checkpoint)?;
        Ok(Preparer {
            source,
            settings,
            inventory,
            state: Mutex::new(state),
        })
    }

    /// The GPUs this preparer plans against (the health stream reads them too).
    pub fn inventory(&self) -> watch::Receiver<Arc<NodeInventory>> {
        self.inventory.clone()
    }

    /// This node's pool.
    pub fn pool(&self) -> &str {
        &self.settings.pool
    }

    /// The CDI device ID the runtime is given for a claim's devices.
    pub fn cdi_device_id(&self, claim_uid: &str) -> String {
        self.settings.cdi.device_id(claim_uid)
    }

    /// The claims prepared now, by UID.
    pub async fn prepared(&self) -> Vec<PreparedClaim> {
        self.state.lock().await.claims.values().cloned().collect()
    }

    /// Prepares `asked`: its devices on this node, their CDI spec, the checkpoint.
    pub async fn prepare(&self, asked: &ClaimRef) -> Result<PreparedClaim, PrepareError> {
        let mut state = self.state.lock().await;
        if let Some(done) = state.claims.get(&asked.uid) {
            // A restarted kubelet asks again; a reboot may have emptied the CDI directory.
            if !self.settings.cdi.spec_path(&asked.uid).exists() {
                self.settings.cdi.write(done)?;
            }
            return Ok(done.clone());
        }
        let found = self.source.get(&asked.namespace, &asked.name).await?;
        let inventory = self.inventory.borrow().clone();
        let prepared = claim::plan(
            asked,
            found.as_ref(),
            claim::Node {
                driver: &self.settings.driver,
                pool: &self.settings.pool,
                inventory: &inventory,
            },
        )?;
        self.settings.cdi.write(&prepared)?;
        state.claims.insert(asked.uid.clone(), prepared.clone());
        if let Err(e) = state.save(&self.settings.checkpoint) {
            state.claims.remove(&asked.uid);
            let _ = self.settings.cdi.remove(&asked.uid);
            return Err(e.into());
        }
        Ok(prepared)
    }

    /// Undoes [`Preparer::prepare`]; a claim never prepared here is already unprepared.
    pub async fn unprepare(&self, asked: &ClaimRef) -> Result<(), PrepareError> {
        let mut state = self.state.lock().await;
        self.settings.cdi.remove(&asked.uid)?;
        if let Some(old) = state.claims.remove(&asked.uid)
            && let Err(e) = state.save(&self.settings.checkpoint)
        {
            state.claims.insert(asked.uid.clone(), old);
            return Err(e.into());
        }
        Ok(())
    }
}
