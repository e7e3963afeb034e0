//! What every driver shares, apart from the loop's own folder ([`crate::scheduler`]): the
//! kept cluster state with its reservations and nominations ([`cluster_cache`] over
//! [`assume`], [`nominations`] and [`pod_index`]), the queues' tree ([`queues`]), placing a
//! unit's members through core's cycle ([`members`]) and the Binding write ([`bind`]). The
//! scheduler's loop and gang stage, the extender and `gpuplace defrag --plan` use them.

pub mod assume;
pub mod bind;
pub mod cluster_cache;
pub mod members;
pub mod nominations;
pub mod pod_index;
pub mod queues;
