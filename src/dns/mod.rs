//! The cluster DNS, in process: what CoreDNS does with k3s's Corefile.

pub mod records;
pub mod resolv;
