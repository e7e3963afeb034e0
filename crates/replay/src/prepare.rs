//! Before the clock starts: what every pod needs made first (queues, claim templates),
//! then the fake nodes, 16 at a time, each with its heartbeat (and, with `--dra`, its
//! ResourceSlices after it).

use futures::stream::{FuturesUnordered, StreamExt};
use gpuplace_model::NodeInventory;

use crate::api::{Object, ReplayApi};
use crate::error::ReplayError;
use crate::flights::create_with_retry;
use crate::objects::{self, ObjectError};

/// Creates the objects every pod needs before the clock starts: `before` (queues, claim
/// templates), then the fake nodes (with `dra`, each with its ResourceSlices).
pub async fn prepare<A: ReplayApi>(
    api: &A,
    run: &str,
    nodes: &[(String, NodeInventory)],
    before: &[Object],
    dra: bool,
) -> Result<u64, ReplayError> {
    let mut requests = 0;
    for object in before {
        create_with_retry(api, object, &mut requests)
            .await
            .map_err(|source| ReplayError::Api {
                doing: format!("creating {} {}", object.kind().name(), object.name()),
                source,
            })?;
    }
    let made: Vec<Vec<Object>> = nodes
        .iter()
        .map(|(name, inv)| node_objects(run, name, inv, dra))
        .collect::<Result<_, _>>()?;
    let mut flights = FuturesUnordered::new();
    let mut next = made.iter();
    loop {
        while flights.len() < 16
            && let Some(objects) = next.next()
        {
            flights.push(async move {
                let mut n = 1;
                let mut done = Ok(());
                for object in objects {
                    done = create_with_retry(api, object, &mut n).await;
                    if done.is_err() {
                        break;
                    }
                    if let Object::Node(node) = object {
                        let name = node.metadata.name.as_deref().unwrap_or_default();
                        done = crate::flights::patiently(|| api.heartbeat(run, name)).await;
                        if done.is_err() {
                            break;
                        }
                    }
                }
                (objects, done, n)
            });
        }
        let Some((objects, done, n)) = flights.next().await else {
            break;
        };
        requests += n;
        done.map_err(|source| ReplayError::Api {
            doing: format!(
                "creating the fake node {}",
                objects.first().map_or("", Object::name)
            ),
            source,
        })?;
    }
    Ok(requests)
}

/// A fake node's objects: the Node, and with `dra` its ResourceSlices after it.
fn node_objects(
    run: &str,
    name: &str,
    inventory: &NodeInventory,
    dra: bool,
) -> Result<Vec<Object>, ObjectError> {
    if !dra {
        let node = objects::fake_node(run, name, inventory)?;
        return Ok(vec![Object::Node(Box::new(node))]);
    }
    let node = crate::claims::dra_node(run, name, inventory)?;
    let slices = crate::claims::node_slices_of(run, name, inventory)?;
    Ok(std::iter::once(Object::Node(Box::new(node)))
        .chain(
            slices
                .into_iter()
                .map(|s| Object::ResourceSlice(Box::new(s))),
        )
        .collect())
}
