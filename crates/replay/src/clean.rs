//! Deleting what replays made: exactly what carries one run's label (after it ends, is
//! interrupted or fails), or everything labelled as a replay's (`gpuplace replay --clean`).
//! Each list and delete is tried again while the server is away or throttling, for
//! [`crate::flights::PATIENCE`].

use crate::api::{ApiError, Kind, ReplayApi};

/// What a clean-up deleted, per kind (in [`Kind::CLEAN_ORDER`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    pub deleted: Vec<(Kind, usize)>,
}

impl Cleaned {
    pub fn total(&self) -> usize {
        self.deleted.iter().map(|(_, n)| n).sum()
    }
}

/// Deletes what run `run` made (its run label), pods first, nodes last.
pub async fn delete_run<A: ReplayApi>(api: &A, run: &str) -> Result<Cleaned, ApiError> {
    delete_selected(api, &crate::labels::run_selector(run)).await
}

/// Deletes every object labelled as a replay's (`gpuplace replay --clean`).
pub async fn delete_labelled<A: ReplayApi>(api: &A) -> Result<Cleaned, ApiError> {
    delete_selected(api, crate::labels::MANAGED_SELECTOR).await
}

/// Deletes what `selector` selects, kind by kind.
async fn delete_selected<A: ReplayApi>(api: &A, selector: &str) -> Result<Cleaned, ApiError> {
    let mut cleaned = Cleaned::default();
    for kind in Kind::CLEAN_ORDER {
        // A clean-up is what runs after a failure, often a busy server's.
        let names = match crate::flights::patiently(|| api.list_labelled(kind, selector)).await {
            Ok(names) => names,
            // A kind the server does not serve (a v1.26 server has no `resource.k8s.io`, a
            // cluster without gpuplace's CRDs no Queue): no replay can have made one there.
            Err(ApiError::NotFound(_)) => Vec::new(),
            Err(e) => return Err(e),
        };
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let deleted = delete_all(api, kind, &names).await?;
        cleaned.deleted.push((kind, deleted));
    }
    Ok(cleaned)
}

/// Deletes `names` of `kind`, 16 at a time; how many were there.
async fn delete_all<A: ReplayApi>(api: &A, kind: Kind, names: &[&str]) -> Result<usize, ApiError> {
    use futures::StreamExt;
    let results: Vec<Result<bool, ApiError>> = futures::stream::iter(names)
        .map(|name| async move {
            let mut requests = 0;
            crate::flights::delete_with_retry(api, kind, name, &mut requests).await
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut deleted = 0;
    for r in results {
        deleted += usize::from(r?);
    }
    Ok(deleted)
}
