//! Deleting what replays made: exactly the objects one replay recorded (after it ends, is
//! interrupted or fails), or everything labelled as a replay's (`gpuplace replay --clean`).

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

/// Deletes `objects` (pods first, nodes last); absent ones are skipped.
pub async fn delete_recorded<A: ReplayApi>(
    api: &A,
    objects: &[(Kind, String)],
) -> Result<Cleaned, ApiError> {
    let mut cleaned = Cleaned::default();
    for kind in Kind::CLEAN_ORDER {
        let names: Vec<&str> = objects
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, n)| n.as_str())
            .collect();
        let deleted = delete_all(api, kind, &names).await?;
        cleaned.deleted.push((kind, deleted));
    }
    Ok(cleaned)
}

/// Deletes every object labelled as a replay's, kind by kind.
pub async fn delete_labelled<A: ReplayApi>(api: &A) -> Result<Cleaned, ApiError> {
    let mut cleaned = Cleaned::default();
    for kind in Kind::CLEAN_ORDER {
        let names = api.list_managed(kind).await?;
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
        .map(|name| api.delete(kind, name))
        .buffer_unordered(16)
        .collect()
        .await;
    let mut deleted = 0;
    for r in results {
        deleted += usize::from(r?);
    }
    Ok(deleted)
}
