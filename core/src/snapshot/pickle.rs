//! Reading and writing PyTorch snapshot pickles (being written).
