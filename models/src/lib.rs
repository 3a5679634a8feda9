//! The model zoo and data loaders.
