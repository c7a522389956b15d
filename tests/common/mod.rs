pub mod examples;
pub mod http_server;
pub mod redis_server;
