# placeholder: owned by a helper
