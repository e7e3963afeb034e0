//! The Kubernetes client every command that talks to a cluster builds.

use std::path::PathBuf;

use anyhow::Context;

/// A client from `kubeconfig`, else the in-cluster config or `$KUBECONFIG`/`~/.kube/config`.
pub(crate) async fn client(kubeconfig: Option<PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(&path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    Ok(kube::Client::try_from(config)?)
}
