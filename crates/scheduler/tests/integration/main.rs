//! The scheduler's integration tests in one binary (one link, the helpers compiled once,
//! and the long stresses run beside the short tests): `cargo test -p gpuplace-scheduler
//! --test integration stress::` runs one file's tests.

mod access;
mod claim_holds;
mod claims;
mod common;
mod defrag;
mod end_to_end;
mod event_driven;
mod events_yield;
mod extended_resources;
mod extender;
mod extender_stress;
mod first_available;
mod interpod;
mod kube_api;
mod make_room_stress;
mod preemption;
mod queue_stress;
mod queues;
mod requirements;
mod status;
mod status_read;
mod stress;
mod twin;
mod ui_browser;
mod usage;
mod usage_stress;
mod volumes;
mod wait_record;
mod waiting;
mod wrapped;
