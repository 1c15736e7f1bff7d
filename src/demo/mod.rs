//! `tollgate demo`: what the quick start needs, in the binary itself, so that the first steps
//! work with the binary alone (or the container image): a JSON echo upstream to put behind the
//! gateway (`upstream`) and a client that shows the rate-limit headers and a 429 (`client`).
//! Nothing of the gateway is used here; the examples `upstream` and `client` are these two.

pub mod client;
pub mod upstream;
