from eksflow.llm.steps.canary.step import main

raise SystemExit(main())
