//! agentrun telemetry
