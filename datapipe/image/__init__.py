"""Images: decoding (PIL, the region JPEG decoder), headers, JPEG markers, EXIF orientation,
view geometry. May import only the leaves (errors, checks, records); never torch at import."""
