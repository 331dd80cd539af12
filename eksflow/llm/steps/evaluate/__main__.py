from eksflow.llm.steps.evaluate.step import main

raise SystemExit(main())
