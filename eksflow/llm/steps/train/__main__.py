from eksflow.llm.steps.train.step import main

raise SystemExit(main())
