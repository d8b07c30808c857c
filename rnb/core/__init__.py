"""Engine-neutral records and vocabulary shared by every engine and by the analysis; imports nothing else of rnb."""
