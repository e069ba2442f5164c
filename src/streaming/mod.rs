//! Streaming subresources (`pods/exec`, `pods/attach`, `pods/portforward`) on the wire: upgrade
//! requests passed through to a backend ([`proxy`]), SPDY/3.1 framing ([`spdy`]), and the
//! WebSocket protocols kubectl speaks ([`websocket`]). The API server uses them towards node
//! endpoints; the node endpoint towards the runtime's CRI streaming server.

pub mod proxy;
pub mod spdy;
mod spdy_dictionary;
pub mod websocket;
