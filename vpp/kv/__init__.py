"""KV caches moving between instances: the hand-over of a prefill instance's caches to a decode
instance of another layout (:mod:`.handover`), the plan of which rank sends which slice
(:mod:`.transfer_plan`, pure Python), KV files in a directory (:mod:`.files`), and generation across
disaggregated instances (:mod:`.disaggregated`)."""
