pub mod browser;
pub mod examples;
pub mod gateway;
pub mod http_server;
pub mod redis_server;
pub mod relay;
pub mod settle;
pub mod smtp;
