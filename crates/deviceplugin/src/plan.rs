//! The handshake: the kubelet gives each container exactly the GPUs the scheduler chose.
//! [`store`] keeps the pods bound to this node and their plans (fed by [`kube`]'s watch),
//! [`identify`] finds which pod and container the kubelet is admitting, and [`handshake`]
//! answers GetPreferredAllocation with the plan, checks Allocate and reconciles the node's
//! truth back onto the pods.

pub mod attribute;
pub mod handshake;
pub mod identify;
pub mod kube;
pub mod store;
