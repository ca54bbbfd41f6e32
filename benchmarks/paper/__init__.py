"""The paper study: the published figures of the VPP paper, the fit of the device constants they do
not give, the sweeps and the paper-scale request streams. Scripts only; the library never imports it."""
