//! (placeholder: filled by the model-based test)
