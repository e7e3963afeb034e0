//! Pure data types shared by every gpuplace component.
//!
//! Nothing here does I/O: the simulator, the scheduler and the device plugin all describe
//! GPUs, nodes, requests and placements with these types, so a decision measured in the
//! simulator is the same value the production adapters carry out.

mod assignment;
mod container;
pub mod device_attributes;
mod inventory;
pub mod keys;
mod need;
pub mod relist;
mod request;

pub use assignment::{
    ALLOCATED_ANNOTATION, ASSIGNMENT_ANNOTATION, Allocated, AnnotationError, Assignment,
    ContainerAssignment, ContainerKind, ContainerNeed, SHARE_RESOURCE, fresh_devices,
    plan_containers,
};
pub use container::{NeedOfContainerError, need_of_container, quantity_milli};
pub use inventory::{Gpu, INVENTORY_ANNOTATION, InventoryError, Link, NodeInventory, PcieLevel};
pub use need::{GpuNeed, GpuTopology, NeedError, UnknownTopology};
pub use relist::{Change, Cursor, ObjectKey, RelistStore};
pub use request::{DeviceShare, MILLI_PER_GPU, Placement, Request, RequestError};
